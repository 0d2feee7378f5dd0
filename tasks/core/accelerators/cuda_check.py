"""Whether CUDA is usable for a task that declared GPUs, and if not, what was found instead.

`torch.cuda.device_count()` asks NVML, which answers without checking that the driver is new enough
for the CUDA runtime torch was built with; `torch.cuda.is_available()` does check. On a node whose
driver is too old the first says "1 GPU" and the second False, and a launcher that trusted the count
would start GPU workers that then train on the CPU. So the check reads both, and NVML's driver version.
When CUDA is not usable it also tries to load the driver's libraries: an image that cannot find them
(tasks/core/accelerators/nvidia_driver.py) looks to torch like a node without a driver.
"""

from __future__ import annotations

from dataclasses import dataclass

from tasks.core.accelerators.nvidia_driver import DriverLibraries, driver_libraries
from tasks.core.accelerators.rule import AcceleratorUnavailable

# The oldest Linux driver each CUDA toolkit release runs on (NVIDIA's CUDA Toolkit release notes,
# "CUDA Toolkit and Corresponding Driver Versions", GA releases).
DRIVER_FLOOR = {
    "12.4": "550.54.14",
    "12.6": "560.28.03",
    "12.8": "570.26",
    "12.9": "575.51.03",
    "13.0": "580.65.06",
}


@dataclass(frozen=True)
class CudaFindings:
    torch_version: str
    cuda_build: str | None  # torch.version.cuda; None for a CPU build
    available: bool  # torch.cuda.is_available()
    device_count: int  # CUDA devices torch can use (0 when not available)
    nvml_gpus: list[str]  # what the driver's NVML reports, whatever CUDA says
    driver: str | None
    nvml_error: str | None = None
    libraries: DriverLibraries = DriverLibraries()  # probed only when CUDA is not usable

    @property
    def driver_floor(self) -> str | None:
        return DRIVER_FLOOR.get(self.cuda_build or "")

    def build(self) -> str:
        if self.cuda_build is None:
            return f"torch {self.torch_version} (a CPU build, without CUDA)"
        floor = f", which needs NVIDIA driver >= {self.driver_floor}" if self.driver_floor else ""
        return f"torch {self.torch_version} built for CUDA {self.cuda_build}{floor}"

    def describe(self) -> str:
        """What this container has, for a refusal message."""
        if self.nvml_error:
            driver = f"no NVIDIA driver is reachable (NVML: {self.nvml_error})"
        else:
            driver = f"NVIDIA driver {self.driver} reports {len(self.nvml_gpus)} GPU(s): {', '.join(self.nvml_gpus)}"
        usable = f"{self.device_count} usable CUDA device(s)" if self.available else "CUDA is not usable"
        # A CPU build needs no driver, so missing libraries are not its cause.
        libraries = self.libraries.describe() if self.cuda_build else ""
        return "; ".join(filter(None, [usable, driver, self.build(), libraries]))


def nvml_readings() -> tuple[list[str], str | None, str | None]:
    """(GPU names, driver version, error) from NVML, which needs only the driver, not CUDA."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            names = [
                pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(index))
                for index in range(pynvml.nvmlDeviceGetCount())
            ]
            return [str(name) for name in names], str(pynvml.nvmlSystemGetDriverVersion()), None
        finally:
            pynvml.nvmlShutdown()
    except Exception as error:  # ImportError, or NVMLError_LibraryNotFound / DriverNotLoaded / ...
        return [], None, f"{type(error).__name__}: {error}"


def cuda_findings() -> CudaFindings:
    import torch

    available = torch.cuda.is_available()
    gpus, driver, error = nvml_readings()
    return CudaFindings(
        torch_version=torch.__version__,
        cuda_build=torch.version.cuda,
        available=available,
        device_count=torch.cuda.device_count() if available else 0,
        nvml_gpus=gpus,
        driver=driver,
        nvml_error=error,
        libraries=DriverLibraries() if available else driver_libraries(),
    )


def require_cuda(expected: str, devices: int, findings: CudaFindings | None = None) -> CudaFindings:
    """Raises AcceleratorUnavailable unless `devices` CUDA devices are usable."""
    findings = findings or cuda_findings()
    if not findings.available or findings.device_count < devices:
        raise AcceleratorUnavailable(f"{expected} for {findings.build()}", findings.describe())
    return findings
