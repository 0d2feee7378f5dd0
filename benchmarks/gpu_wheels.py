"""`python -m benchmarks.gpu_wheels` (`make gpu-wheels`): the wheels a GPU machine without Flyte needs for
`pyflyte run` of the pipeline, for its Python and platform, small enough to carry there.

A GPU machine with a CUDA build of torch but no flytekit and no package index runs the pipeline as a
user does once flytekit and what the run imports are installed from a folder of wheels: the GPU check
installs `.gpu-wheels/` offline, with `--no-deps`, into `.gpu-site/` and puts that on the path of its
own process and of those it starts (`use_carried_wheels`).
Which distributions the run needs is measured, not listed by hand: the embedded digits pipeline runs
here with an import hook in every process it starts (DDP workers too), and every distribution whose
modules it imported is taken, at the version installed here (constraints.txt's), less those the GPU
machine's image brings (FROM_IMAGE): its torch, and the large packages built beside it. A run there
that still lacks one fails importing it, naming it.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata as metadata
import importlib.util
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.measure import REPO

# Installed in the GPU image and used as it has them: torch (the point of the machine) and the large
# binary packages beside it, whose versions the pipeline does not depend on. Everything else the run
# imports travels, so that flytekit finds the versions it was tested with.
FROM_IMAGE = frozenset(
    {
        "torch", "triton", "numpy", "pandas", "pyarrow", "scipy", "scikit-learn", "onnx", "onnx-ir",
        "onnxruntime", "onnxscript", "tensorboard", "grpcio", "matplotlib", "pillow", "fonttools",
        "kiwisolver", "contourpy", "sympy", "networkx", "mpmath", "nvidia-ml-py", "setuptools",
    }
)  # fmt: skip
# pip matches a platform tag exactly: every tag a wheel for x86-64 Linux may carry.
PLATFORMS = [f"manylinux_2_{minor}_x86_64" for minor in (17, 24, 27, 28, 31, 34, 35)] + [
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
    "manylinux_2_5_x86_64",
]
WHEELS_DIR = REPO / ".gpu-wheels"
SITE_DIR = REPO / ".gpu-site"
PROJECT = "mixedml"  # runs from the repository there, not installed
# What travels to the GPU machine, the repository included, must stay under 64 MiB.
CARRY_LIMIT_MIB = 56
TRACE_HOOK = """import atexit, os, sys
def _write_imports():
    path = os.path.join(os.environ["MIXEDML_IMPORT_TRACE"], f"{os.getpid()}.txt")
    with open(path, "w") as out:
        out.write("\\n".join(sorted({name.split(".")[0] for name in list(sys.modules)})))
atexit.register(_write_imports)
"""


def normalised(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def imported_by_a_run(command: list[str]) -> set[str]:
    """The top-level modules every process of `command` (run in the repository) imported."""
    with tempfile.TemporaryDirectory(prefix="mixedml-imports-") as tmp:
        hook, traces = Path(tmp, "hook"), Path(tmp, "traces")
        hook.mkdir(), traces.mkdir()
        (hook / "sitecustomize.py").write_text(TRACE_HOOK)
        path = os.pathsep.join(filter(None, [str(hook), os.environ.get("PYTHONPATH", "")]))
        env = {**os.environ, "PYTHONPATH": path, "MIXEDML_IMPORT_TRACE": str(traces)}
        done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(
                f"the traced run failed ({done.returncode}):\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
            )
        return {name for trace in traces.glob("*.txt") for name in trace.read_text().split()}


def distributions_of(modules: set[str]) -> dict[str, str]:
    """{distribution: installed version} for the distributions providing `modules`, this project aside."""
    providers: dict[str, set[str]] = {}
    # A top-level name as a distribution declares it, which may be a path ("protoc_gen_openapiv2/options",
    # flyteidl's namespace package): its first part is the module imported.
    for declared, dists in metadata.packages_distributions().items():
        providers.setdefault(declared.split("/")[0], set()).update(dists)
    names = {dist for module in modules for dist in providers.get(module, ())}
    return {name: metadata.version(name) for name in names if normalised(name) != PROJECT}


def to_carry(versions: dict[str, str]) -> dict[str, str]:
    """The distributions the GPU machine lacks: all but FROM_IMAGE's and the CUDA libraries."""
    image = {normalised(name) for name in FROM_IMAGE}
    return {
        name: version
        for name, version in sorted(versions.items(), key=lambda item: normalised(item[0]))
        if normalised(name) not in image and not normalised(name).startswith("nvidia-")
    }


def download_command(pins: dict[str, str], python_version: str, dest: Path) -> list[str]:
    platforms = [flag for tag in PLATFORMS for flag in ("--platform", tag)]
    return [
        sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
        "--python-version", python_version, "--implementation", "cp", *platforms, "--dest", str(dest),
        *(f"{name}=={version}" for name, version in pins.items()),
    ]  # fmt: skip


def folder_mib(folder: Path) -> float:
    return sum(path.stat().st_size for path in folder.glob("*.whl")) / 2**20


def pipeline_command() -> list[str]:
    """The embedded digits pipeline as `make run` runs it (on this machine's CPU)."""
    pyflyte = [sys.executable, "-m", "flytekit.clis.sdk_in_container.pyflyte"]
    return [*pyflyte, "run", "workflows/pipeline.py", "training_pipeline"]


def use_carried_wheels(wheels: Path = WHEELS_DIR, site: Path = SITE_DIR) -> str:
    """Where flytekit is missing and `wheels` holds wheels: install them offline into `site` and put it
    first on this process's path and on its children's (PYTHONPATH). Says what it did or why it could
    not, or '' where it had nothing to do."""
    if importlib.util.find_spec("flytekit") is not None or not any(wheels.glob("*.whl")):
        return ""
    install = [sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps", "--no-compile",
               "--upgrade", "--target", str(site), *map(str, sorted(wheels.glob("*.whl")))]  # fmt: skip
    done = subprocess.run(install, capture_output=True, text=True)
    if done.returncode != 0:  # the steps that need flytekit then skip, saying it is missing
        return f"could not install the wheels in {wheels.name} (pip exited {done.returncode}): {done.stderr[-2000:]}"
    sys.path.insert(0, str(site))
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
    importlib.invalidate_caches()
    return f"installed {len(list(wheels.glob('*.whl')))} wheels from {wheels.name} into {site.name}"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--python-version", default="3.12", help="the GPU machine's Python (default 3.12)")
    parser.add_argument(
        "--dest", type=Path, default=WHEELS_DIR, help="the folder written (default .gpu-wheels)"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    print("running the embedded digits pipeline to see what it imports ...", flush=True)
    pins = to_carry(distributions_of(imported_by_a_run(pipeline_command())))
    args.dest.mkdir(parents=True, exist_ok=True)
    for stale in args.dest.glob("*.whl"):
        stale.unlink()
    subprocess.run(download_command(pins, args.python_version, args.dest), check=True)
    size = folder_mib(args.dest)
    print(f"{len(pins)} wheels for Python {args.python_version}, {size:.1f} MiB, in {args.dest}:")
    print("  " + " ".join(f"{name}=={version}" for name, version in pins.items()))
    if size > CARRY_LIMIT_MIB:
        print(f"more than {CARRY_LIMIT_MIB} MiB: too large to carry beside the repository", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
