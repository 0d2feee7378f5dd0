"""GKE's GPUDirect networking where processes are started (tasks/gpudirect.py): the variable read
where tasks.hardware is imported at registration, and the node's NCCL profile sourced by a shell before
the launcher plans any worker (what each pod declares: tests/unit/deploy/test_gpudirect.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tasks.gpudirect import PROFILE_VARIABLE, apply_node_profile
from tasks.hardware import GPUDIRECT_VARIABLE
from tests.flyte_package import REPO


@pytest.mark.slow  # a fresh interpreter: the variable is read when tasks.hardware is imported
def test_the_cluster_turns_gpudirect_on_at_registration():
    """MIXEDML_GPUDIRECT=1 where the tasks are serialized puts the multi-node profile's pods on it (its
    task is decorated with the profile's options: tests/unit/tasks/test_hardware.py); only that one."""
    probe = (
        "from tasks.hardware import TRAIN_GPU, TRAIN_GPU_MULTINODE as multinode; "
        "print(sorted(multinode.pod_template().annotations or {}), TRAIN_GPU.gpudirect)"
    )
    registering = {**os.environ, GPUDIRECT_VARIABLE: "1"}
    result = subprocess.run([sys.executable, "-c", probe], cwd=REPO, env=registering, capture_output=True,
                            text=True, timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert "networking.gke.io/interfaces" in result.stdout
    assert "devices.gke.io/container.tcpx-daemon" in result.stdout
    assert result.stdout.split()[-1] == "False"  # the single-node profile is never on it


PROFILE = """echo "the profile's own output"
export NCCL_PROTO=Simple
NCCL_ALGO=Ring,Tree
NCCL_DEBUG=INFO
"""


def test_the_node_profile_is_sourced_into_the_environment_the_workers_inherit(tmp_path):
    """Exported or plain assignments alike; what the shell sets of itself (SHLVL, PWD) is not copied."""
    script = tmp_path / "nccl-env-profile.sh"
    script.write_text(PROFILE)
    environ = {PROFILE_VARIABLE: str(script), "NCCL_DEBUG": "WARN", "PATH": "/usr/bin:/bin"}
    changed = apply_node_profile(environ)
    assert changed == {"NCCL_PROTO": "Simple", "NCCL_ALGO": "Ring,Tree", "NCCL_DEBUG": "INFO"}
    assert environ == {PROFILE_VARIABLE: str(script), "PATH": "/usr/bin:/bin", **changed}


def test_a_failing_profile_fails_the_launch_with_its_error(tmp_path):
    script = tmp_path / "nccl-env-profile.sh"
    script.write_text("echo 'no plugin here' >&2\nfalse\n")
    with pytest.raises(RuntimeError, match="no plugin here"):
        apply_node_profile({PROFILE_VARIABLE: str(script), "PATH": "/usr/bin:/bin"})


def test_the_launcher_loads_the_profile_before_it_plans_the_workers(tmp_path, monkeypatch):
    """The launch reads the profile first: what plan_launch, and after it every worker, sees has it."""
    import tasks.train_torch as train_torch

    class Planned(Exception):
        pass

    seen = {}

    def plan_launch(*args, **kwargs):
        seen.update(NCCL_PROTO=train_torch.os.environ.get("NCCL_PROTO"))
        raise Planned

    script = tmp_path / "nccl-env-profile.sh"
    script.write_text("export NCCL_PROTO=Simple\n")
    monkeypatch.setenv(PROFILE_VARIABLE, str(script))
    monkeypatch.setenv("NCCL_PROTO", "unset by the test")  # so that monkeypatch restores it
    monkeypatch.setattr(train_torch, "plan_launch", plan_launch)
    with pytest.raises(Planned):
        train_torch.train_torch_multinode._launch_fitted()
    assert seen == {"NCCL_PROTO": "Simple"}
