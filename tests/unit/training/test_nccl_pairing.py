"""Which NCCL a worker on GKE's GPUDirect networking runs: named at start-up, and held to the one pairing of
NCCL core and plugin this project supports (tasks/core/training/nccl_pairing.py says why that one)."""

from __future__ import annotations

import ctypes
from pathlib import Path

import pytest

from tasks.core.training import nccl_pairing
from tasks.core.training.nccl_pairing import (
    NCCL_OF_TORCH,
    PAIRINGS,
    POD_LIBRARIES,
    STACK_VARIABLE,
    UnsupportedNccl,
    checked_nccl,
    nccl_libraries,
)

REPO = Path(__file__).resolve().parents[3]
TORCH_NCCL = "/opt/venv/lib/python3.11/site-packages/nvidia/nccl/lib/libnccl.so.2"
NODE_NCCL = f"{POD_LIBRARIES}/libnccl.so.2"
PLUGIN = f"{POD_LIBRARIES}/libnccl-net.so"


def maps_with(*libraries: str) -> str:
    """/proc/self/maps text mapping `libraries` beside the interpreter and an anonymous mapping."""
    lines = ["55d0c0a00000-55d0c0a01000 r--p 00000000 08:01 131 /opt/venv/bin/python3.11"]
    for number, library in enumerate(libraries):
        lines += [
            f"7f{number}a00000000-7f{number}a0100000 r--p 00000000 08:01 {900 + number} {library}",
            f"7f{number}a01000000-7f{number}a0800000 r-xp 00100000 08:01 {900 + number} {library}",
        ]
    lines.append("7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0                          [stack]")
    return "\n".join(lines) + "\n"


def check(stack: str | None, *libraries: str, version=(2, 29, 7), plugin_on_node=True) -> str | None:
    environ = {STACK_VARIABLE: stack} if stack else {}
    return checked_nccl(
        environ,
        maps=lambda: maps_with(*libraries),
        version_of=lambda library: version,
        exists=lambda path: plugin_on_node and path == PLUGIN,
    )


def test_off_gpudirect_nothing_is_read_or_checked():
    def unread():
        raise AssertionError("maps read off GPUDirect")

    assert checked_nccl({}, maps=unread) is None


@pytest.mark.parametrize("stack", ["tcpx", "tcpxo"])
def test_torchs_own_nccl_with_the_nodes_plugin_is_named_at_start_up(stack):
    said = check(stack, TORCH_NCCL)
    assert f"NCCL 2.29.7 from {TORCH_NCCL} (torch's own)" in said
    assert PLUGIN in said and PAIRINGS[stack].plugin in said
    assert f"qualifies that plugin with NCCL {PAIRINGS[stack].qualified}" in said


def test_the_nodes_own_nccl_core_is_refused_naming_both_pairings():
    with pytest.raises(UnsupportedNccl) as refused:
        check("tcpx", NODE_NCCL, version=(2, 19, 3))
    message = str(refused.value)
    assert f"runs NCCL 2.19.3 from {NODE_NCCL}" in message
    assert "with torch's own NCCL 2.29.7" in message and "qualifies the plugin with NCCL 2.19.3" in message


def test_the_node_folders_nccl_is_refused_even_at_torchs_version():
    with pytest.raises(UnsupportedNccl, match="runs NCCL 2.29.7 from /usr/local/nvidia/lib64"):
        check("tcpxo", NODE_NCCL)


def test_another_torch_nccl_is_refused_until_its_pairing_is_checked():
    with pytest.raises(UnsupportedNccl, match="runs NCCL 2.30.1 from .*check the new pairing"):
        check("tcpx", TORCH_NCCL, version=(2, 30, 1))


@pytest.mark.parametrize("libraries", [(), (TORCH_NCCL, NODE_NCCL)], ids=["none", "two"])
def test_anything_but_one_nccl_core_loaded_is_refused(libraries):
    with pytest.raises(UnsupportedNccl, match="exactly one NCCL core"):
        check("tcpx", *libraries)


def test_a_node_without_the_plugin_fails_naming_the_installer():
    with pytest.raises(UnsupportedNccl, match="installer DaemonSet has not run on this node"):
        check("tcpxo", TORCH_NCCL, plugin_on_node=False)


def test_an_unknown_stack_is_refused():
    with pytest.raises(UnsupportedNccl, match="names no GPUDirect stack"):
        check("rdma", TORCH_NCCL)


def test_only_nccl_core_files_are_read_from_the_maps():
    maps = maps_with(TORCH_NCCL, PLUGIN, "/opt/venv/lib/python3.11/site-packages/torch/lib/libtorch_cuda.so")
    assert nccl_libraries(maps) == [TORCH_NCCL]


def test_the_version_is_the_loaded_files_own(monkeypatch):
    """ncclGetVersion's code, major * 10000 + minor * 100 + patch since NCCL 2.9."""

    class Library:
        def ncclGetVersion(self, code):  # noqa: N802 - NCCL's name
            ctypes.cast(code, ctypes.POINTER(ctypes.c_int)).contents.value = 22907
            return 0

    monkeypatch.setattr(nccl_pairing.ctypes, "CDLL", lambda path: Library())
    assert nccl_pairing.version_of(TORCH_NCCL) == (2, 29, 7)


def test_the_pairing_follows_the_pinned_torch():
    """A torch upgrade brings another NCCL: this fails until its pairing with each plugin is checked."""
    pins = dict(line.split("==") for line in (REPO / "constraints.txt").read_text().split() if "==" in line)
    assert pins["torch"] in NCCL_OF_TORCH
    assert {pairing.nccl for pairing in PAIRINGS.values()} == {NCCL_OF_TORCH[pins["torch"]]}


def test_a_worker_on_gpudirect_checks_its_nccl_before_it_reads_anything(monkeypatch):
    """The CPU build of torch loads no NCCL: on a GPUDirect pod that fails the worker at start-up,
    before it touches its inputs (None here)."""
    from tasks.ddp_worker import train_with_ddp

    monkeypatch.setenv(STACK_VARIABLE, "tcpx")
    monkeypatch.setattr("tasks.ddp_worker.begin_task", lambda: None)
    with pytest.raises(UnsupportedNccl, match="exactly one NCCL core loaded; found none"):
        train_with_ddp(None, None, None)
