"""Hardware utilisation sampled in the background while training runs."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import psutil


@dataclass
class Sample:
    seconds: float
    cpu_percent: float
    ram_gib: float
    gpu_percent: list[float] = field(default_factory=list)
    gpu_memory_gib: list[float] = field(default_factory=list)


def nvml_handles() -> list:
    """NVML device handles, or none where there is no NVIDIA driver (CPU machines, TPU VMs)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        return [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
    except Exception:  # the library or the driver is absent: no GPU telemetry, not an error
        return []


class UtilisationSampler:
    """Samples CPU, RAM and (through NVML) GPU utilisation every `interval_s` on a daemon thread."""

    def __init__(self, interval_s: float = 2.0):
        self.interval_s = interval_s
        self.samples: list[Sample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._gpus = nvml_handles()
        self._start = time.monotonic()

    def __enter__(self) -> UtilisationSampler:
        psutil.cpu_percent()  # the first reading is meaningless; prime it
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.sample()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def sample(self) -> None:
        gpu_percent, gpu_memory = [], []
        if self._gpus:
            import pynvml

            for handle in self._gpus:
                gpu_percent.append(float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu))
                gpu_memory.append(pynvml.nvmlDeviceGetMemoryInfo(handle).used / 2**30)
        self.samples.append(
            Sample(
                seconds=time.monotonic() - self._start,
                cpu_percent=psutil.cpu_percent(),
                ram_gib=psutil.virtual_memory().used / 2**30,
                gpu_percent=gpu_percent,
                gpu_memory_gib=gpu_memory,
            )
        )
