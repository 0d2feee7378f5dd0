"""Run several `pyflyte` command lines in one process, each through pyflyte's own click entry point.

    python tests/workers/readme_driver.py COMMANDS.json RESULTS.json CACHE_DIR

COMMANDS.json holds a list of argument lists, each starting with the pyflyte executable as a shell
would run it. Every command is parsed and run by `flytekit.clis.sdk_in_container.pyflyte.main`
as the `pyflyte` script runs it (standalone click, which ends in SystemExit); what the commands
share is the process start-up and the modules imported (flytekit, torch, the workflows). RESULTS.json gets, per command, its
exit code and what it wrote to stdout and stderr (captured at the file descriptors, so rich consoles,
loggers and child processes are caught too); it is rewritten after every command, so a crash leaves
the results of the commands before it. CACHE_DIR is the flytekit local task cache for these runs,
apart from the user's.

What one run could leave behind for the next is put back between commands: the environment
variables, the working directory, `sys.argv` and flytekit's context stack; and the "already shown"
warning registries are emptied, so a warning (click's "used more than once", say) shows for every
command as it would in a fresh process. Modules are imported once, by the first command that needs
them, so what an import sets up for the process (such as the warning filter in workflows/__init__.py)
stays for the later commands, as each fresh process would have set it up again.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path

# Python puts a script's folder first on sys.path; drop it, as the `pyflyte` script sees no tests/.
if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
    sys.path.pop(0)


def exit_code(stop: SystemExit) -> int:
    """The status the interpreter would exit with for this SystemExit."""
    if stop.code is None:
        return 0
    if isinstance(stop.code, int):
        return stop.code
    print(stop.code, file=sys.stderr)  # the interpreter prints a non-integer code, then exits 1
    return 1


def invoke(argv: list[str]) -> int:
    """One pyflyte command line, as the `pyflyte` script runs it; returns its exit status."""
    from flytekit.clis.sdk_in_container.pyflyte import main

    sys.argv = [Path(argv[0]).name, *argv[1:]]
    try:
        main.main(args=argv[1:], prog_name=sys.argv[0])
    except SystemExit as stop:
        return exit_code(stop)
    except BaseException:  # standalone click exits on its own; anything else is an uncaught crash
        traceback.print_exc()
        return 1
    return 0


def forget_shown_warnings() -> None:
    """Let every warning show again, once per command as in a fresh process. A change to the warning
    filters empties the "already shown" registries, and entering and leaving `catch_warnings` is
    one that puts the filters back as they were."""
    with warnings.catch_warnings():
        pass


def run_captured(argv: list[str]) -> dict:
    """Run one command with fds 1 and 2 sent to files and the process state put back afterwards."""
    from flytekit.core.context_manager import FlyteContextManager

    environment, cwd, sys_argv = dict(os.environ), os.getcwd(), list(sys.argv)
    contexts = FlyteContextManager.size()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        sys.stdout.flush()
        sys.stderr.flush()
        saved = os.dup(1), os.dup(2)
        os.dup2(out.fileno(), 1)
        os.dup2(err.fileno(), 2)
        try:
            forget_shown_warnings()
            start = time.monotonic()
            code = invoke(argv)
            seconds = time.monotonic() - start
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])
            os.environ.clear()
            os.environ.update(environment)
            os.chdir(cwd)
            sys.argv = sys_argv
            while FlyteContextManager.size() > contexts:
                FlyteContextManager.pop_context()
        out.seek(0)
        err.seek(0)
        return {
            "argv": argv,
            "returncode": code,
            "seconds": round(seconds, 1),
            "stdout": out.read().decode(errors="replace"),
            "stderr": err.read().decode(errors="replace"),
        }


def main(commands_file: str, results_file: str, cache_dir: str) -> None:
    from flytekit.core import local_cache

    local_cache.CACHE_LOCATION = cache_dir
    local_cache.LocalTaskCache._initialized = False

    commands = json.loads(Path(commands_file).read_text())
    results: list[dict] = []
    for argv in commands:
        results.append(run_captured(argv))
        partial = Path(f"{results_file}.partial")
        partial.write_text(json.dumps(results))
        partial.replace(results_file)  # whole or absent, even if the process is killed
        result = results[-1]
        print(f"exit {result['returncode']} after {result['seconds']} s: {' '.join(argv[1:])}", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
