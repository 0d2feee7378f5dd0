"""Whether this process can load the NVIDIA driver's user-space libraries, and where a GKE node puts them.

CUDA (torch, TensorFlow) opens `libcuda.so.1` and NVML opens `libnvidia-ml.so.1` with dlopen, which
searches LD_LIBRARY_PATH and the linker cache. Under the NVIDIA container toolkit the libraries are
injected into the linker's paths. GKE's device plugin instead mounts the node's driver at
/usr/local/nvidia in every GPU container (GoogleCloudPlatform/container-engine-accelerators,
cmd/nvidia_gpu/nvidia_gpu.go: the `-container-path` flag, default "/usr/local/nvidia", is the mount
`main` hands to the plugin) and sets no variable for it (pkg/gpu/nvidia/manager.go: `Envs` returns
only MPS limits, else an empty map); Google's own GPU manifests set
LD_LIBRARY_PATH=/usr/local/nvidia/lib64 themselves (cmd/nvidia_gpu/device-plugin.yaml,
gpudirect-rdma/nccl-test.yaml). An image without that variable sees no driver on GKE.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

DRIVER_LIBRARIES = ("libcuda.so.1", "libnvidia-ml.so.1")
GKE_DRIVER_LIBRARY_DIR = "/usr/local/nvidia/lib64"


@dataclass(frozen=True)
class DriverLibraries:
    """Which driver libraries did not load, and what the library path was."""

    unloadable: tuple[str, ...] = ()
    library_path: str | None = None  # LD_LIBRARY_PATH
    in_gke_dir: tuple[str, ...] = ()  # the unloadable ones present under GKE's mount

    def describe(self) -> str:
        """Why CUDA cannot reach the driver, for a refusal message; '' when every library loaded."""
        if not self.unloadable:
            return ""
        path = f"LD_LIBRARY_PATH={self.library_path}" if self.library_path else "LD_LIBRARY_PATH is unset"
        present = (
            f"; they are there, under {GKE_DRIVER_LIBRARY_DIR}, which is not on it" if self.in_gke_dir else ""
        )
        return (
            f"the NVIDIA driver libraries {', '.join(self.unloadable)} cannot be loaded: they were not "
            f"found on the library path ({path}){present}. GKE mounts them at {GKE_DRIVER_LIBRARY_DIR} "
            "without setting LD_LIBRARY_PATH, so the image must set it (the Dockerfile's GPU stages do)"
        )


def driver_libraries(environ: Mapping[str, str] = os.environ) -> DriverLibraries:
    """Tries to load each driver library the way CUDA and NVML do (dlopen by soname)."""
    unloadable = []
    for name in DRIVER_LIBRARIES:
        try:
            ctypes.CDLL(name)
        except OSError:
            unloadable.append(name)
    return DriverLibraries(
        unloadable=tuple(unloadable),
        library_path=environ.get("LD_LIBRARY_PATH"),
        in_gke_dir=tuple(name for name in unloadable if (Path(GKE_DRIVER_LIBRARY_DIR) / name).exists()),
    )
