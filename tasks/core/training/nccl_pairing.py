"""Which NCCL a torch worker runs on GKE's GPUDirect networking, said at start-up and held to the one
pairing of NCCL core and GPUDirect plugin that this project supports.

Google's installer puts its own NCCL core (`libnccl.so.2`) beside the plugin (`libnccl-net.so`) in the
node's folder, the core it qualifies the plugin with: NCCL 2.19.3 for TCPX plugin v3.1.9
(GoogleCloudPlatform/container-engine-accelerators at 98c85a6e, `gpudirect-tcpx/README.md`, "Feb 15,
2024"), 2.28.7-1 for TCPXO plugin v1.0.15 (`gpudirect-tcpxo/README.md`, "Jan 9, 2026"). torch 2.13
cannot run on either: its `libtorch_cuda.so` binds NCCL 2.29 symbols (`ncclCommSuspend`,
`ncclCommMemStats`, `ncclPutSignal`, ...; `nm -D --undefined-only`) that NVIDIA/nccl's `src/nccl.h.in`
lacks at v2.19.3-1 and v2.28.7-1, so preloading the node's core fails at `import torch`. What runs is
torch's own: `torch/__init__.py` (`_load_global_deps`, `_preload_cuda_deps`) loads the nvidia-nccl wheel's
`libnccl.so.2` before anything else, and `libtorch_cuda.so`'s RPATH names the wheel's folder, which the
loader searches before LD_LIBRARY_PATH. That core, NCCL 2.29.7, still takes both plugins: it looks for
`ncclNetPlugin_v7` among the versions it loads (NVIDIA/nccl v2.29.7-1, `src/plugin/net.cc`), which is
the one both export (google/nccl-plugin-gpudirecttcpx `src/nccl_plugin.cc`; google/nccl-plugin-gpudirect-
tcpxo v1.0.15, `fastrak_plugin.cc`), and TCPX's device-side unpack is at the version it was built for
(`NCCL_NET_DEVICE_UNPACK_VERSION` 0x7 in both). Google has not qualified that pairing, so it is held
exactly: another torch, or another NCCL, fails the worker at start-up until someone checks it again.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Mapping
from dataclasses import dataclass

# Set in a GPUDirect pod (tasks/gpudirect.py) to the stack's name; unset elsewhere, where nothing is checked.
STACK_VARIABLE = "MIXEDML_GPUDIRECT_STACK"
# Where a GPUDirect pod mounts the node's folder that the installer fills (Google's manifests mount it there).
POD_LIBRARIES = "/usr/local/nvidia/lib64"
PLUGIN = "libnccl-net.so"
# The NCCL that each torch release's CUDA wheel on PyPI requires (torch 2.13.0: nvidia-nccl-cu13==2.29.7).
NCCL_OF_TORCH = {"2.13.0": (2, 29, 7)}


@dataclass(frozen=True)
class Pairing:
    plugin: str  # the plugin the node's installer puts beside its NCCL
    qualified: str  # the NCCL core Google qualifies that plugin with
    nccl: tuple[int, int, int]  # the NCCL core the workers run it with: torch's own


PAIRINGS = {
    "tcpx": Pairing("GPUDirect-TCPX plugin v3.1.9", "2.19.3", NCCL_OF_TORCH["2.13.0"]),
    "tcpxo": Pairing("GPUDirect-TCPXO plugin v1.0.15", "2.28.7-1", NCCL_OF_TORCH["2.13.0"]),
}


class UnsupportedNccl(RuntimeError):
    """The NCCL this worker loaded is not the one its GPUDirect plugin is paired with here."""


def nccl_libraries(maps: str) -> list[str]:
    """The NCCL core files mapped into a process, from its /proc/PID/maps text."""
    paths = {line.split(None, 5)[5] for line in maps.splitlines() if len(line.split(None, 5)) == 6}
    return sorted(path for path in paths if os.path.basename(path).startswith("libnccl.so"))


def version_of(library: str) -> tuple[int, int, int]:
    """The version the loaded NCCL file reports itself (`ncclGetVersion`), not the one torch was built with."""
    code = ctypes.c_int()
    if ctypes.CDLL(library).ncclGetVersion(ctypes.byref(code)) != 0:
        raise UnsupportedNccl(f"{library}: ncclGetVersion failed")
    return code.value // 10000, code.value // 100 % 100, code.value % 100  # NCCL >= 2.9's encoding


def own_maps() -> str:
    with open("/proc/self/maps") as maps:
        return maps.read()


def checked_nccl(
    environ: Mapping[str, str], maps=own_maps, version_of=version_of, exists=os.path.exists
) -> str | None:
    """What this process runs NCCL with on GPUDirect, as a sentence for its log; None off GPUDirect.
    Raises UnsupportedNccl where that is not the stack's pairing. Call it once torch is imported."""
    stack = environ.get(STACK_VARIABLE)
    if not stack:
        return None
    pairing = PAIRINGS.get(stack)
    if pairing is None:
        raise UnsupportedNccl(f"{STACK_VARIABLE}={stack} names no GPUDirect stack ({', '.join(PAIRINGS)})")
    library = the_one_library(nccl_libraries(maps()), stack)
    version = version_of(library)
    expected = ".".join(map(str, pairing.nccl))
    found = f"NCCL {'.'.join(map(str, version))} from {library}"
    if version != pairing.nccl or library.startswith(POD_LIBRARIES + "/"):
        raise UnsupportedNccl(
            f"GPUDirect-{stack.upper()} runs {found}; this image pairs the {pairing.plugin} with torch's "
            f"own NCCL {expected} (Google qualifies the plugin with NCCL {pairing.qualified}, which torch "
            "cannot load): check the new pairing before changing torch or preloading another NCCL "
            "(tasks/core/training/nccl_pairing.py)"
        )
    plugin = os.path.join(POD_LIBRARIES, PLUGIN)
    if not exists(plugin):
        raise UnsupportedNccl(
            f"{plugin} is missing: GPUDirect's NCCL installer DaemonSet has not run on this node "
            "(deploy/gpudirect/README.md), and NCCL would fall back to the primary NIC alone"
        )
    return (
        f"GPUDirect-{stack.upper()}: {found} (torch's own) with the node's {pairing.plugin} ({plugin}); "
        f"Google qualifies that plugin with NCCL {pairing.qualified}"
    )


def the_one_library(libraries: list[str], stack: str) -> str:
    if len(libraries) != 1:
        loaded = ", ".join(libraries) or "none"
        raise UnsupportedNccl(f"GPUDirect-{stack.upper()} needs exactly one NCCL core loaded; found {loaded}")
    return libraries[0]
