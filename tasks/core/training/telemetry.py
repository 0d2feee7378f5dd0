"""Hardware utilisation sampled in the background while training runs.

Telemetry never fails a task: a reading the device does not support (NVML reports no utilisation for
MIG devices, `nvmlDeviceGetUtilizationRates` raises NVMLError_NotSupported there) is recorded as NaN,
and any other error is logged once and sampling goes on.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import psutil

log = logging.getLogger(__name__)


@dataclass
class Sample:
    seconds: float
    cpu_percent: float
    ram_gib: float
    gpu_percent: list[float] = field(default_factory=list)
    gpu_memory_gib: list[float] = field(default_factory=list)


def nvml_devices() -> tuple[object | None, list]:
    """(the NVML module, device handles); (None, []) without the library or an NVIDIA driver
    (CPU machines, TPU VMs): no GPU telemetry there, which is not an error."""
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml, [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
    except Exception:
        return None, []


class UtilisationSampler:
    """Samples CPU, RAM and (through NVML) GPU utilisation every `interval_s` on a daemon thread."""

    def __init__(self, interval_s: float = 2.0):
        self.interval_s = interval_s
        self.samples: list[Sample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._nvml, self._gpus = nvml_devices()
        self._start = time.monotonic()
        self._failed = False

    def __enter__(self) -> UtilisationSampler:
        psutil.cpu_percent()  # the first reading is meaningless; prime it
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._sample_logging_errors()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample_logging_errors()

    def _sample_logging_errors(self) -> None:
        try:
            self.sample()
        except Exception as error:
            if not self._failed:
                log.warning(
                    "utilisation sampling failed (%s: %s); training goes on", type(error).__name__, error
                )
            self._failed = True

    def sample(self) -> None:
        gpu_percent, gpu_memory = [], []
        for handle in self._gpus:
            gpu_percent.append(reading(lambda h=handle: self._nvml.nvmlDeviceGetUtilizationRates(h).gpu))
            gpu_memory.append(reading(lambda h=handle: self._nvml.nvmlDeviceGetMemoryInfo(h).used / 2**30))
        self.samples.append(
            Sample(
                seconds=time.monotonic() - self._start,
                cpu_percent=psutil.cpu_percent(),
                ram_gib=psutil.virtual_memory().used / 2**30,
                gpu_percent=gpu_percent,
                gpu_memory_gib=gpu_memory,
            )
        )


def reading(read: Callable[[], float]) -> float:
    """One NVML reading, NaN where the device does not support it (or it fails)."""
    try:
        return float(read())
    except Exception:
        return math.nan
