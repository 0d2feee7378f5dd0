from __future__ import annotations

import io
import logging
import math
import time
from types import SimpleNamespace

from tasks.core.training import telemetry
from tasks.core.training.progress import ProgressReporter
from tasks.core.training.telemetry import UtilisationSampler
from tasks.plumbing.decks import utilisation_section


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_terminal_progress_redraws_one_line_with_epoch_step_and_loss():
    terminal = Terminal()
    reporter = ProgressReporter(epochs=3, stream=terminal)
    reporter.step(0, 10, 10, lambda: 0.5)
    reporter.epoch_end()
    assert "\repoch 1/3 step 10/10 loss 0.5000" in terminal.getvalue()
    assert terminal.getvalue().endswith("\n")


class Collect(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def test_pod_logs_get_plain_lines_at_a_bounded_rate():
    log_stream = io.StringIO()  # not a TTY, like a pod's stdout
    reporter = ProgressReporter(epochs=2, stream=log_stream, log_every_s=0.2)
    reads = []
    logger, collect = logging.getLogger("tasks.core.training.progress"), Collect()
    logger.addHandler(collect)
    logger.setLevel(logging.INFO)
    try:
        for step in range(1, 2001):
            reporter.step(0, step, 2000, lambda: reads.append(1) or 0.25)
        time.sleep(0.25)
        reporter.step(0, 2000, 2000, lambda: 0.25)
    finally:
        logger.removeHandler(collect)
    lines = collect.lines
    assert 1 <= len(lines) <= 3, lines  # not one line per step
    assert lines[-1] == "epoch 1/2 step 2000/2000 loss 0.2500"
    assert log_stream.getvalue() == ""  # no carriage-return bar in logs
    assert len(reads) <= 2  # the loss (a device sync) is only read when shown


def test_other_ranks_report_nothing():
    terminal = Terminal()
    ProgressReporter(epochs=1, enabled=False, stream=terminal).step(0, 1, 1, lambda: 1.0)
    assert terminal.getvalue() == ""


def test_sampler_records_cpu_and_memory():
    with UtilisationSampler(interval_s=0.05) as sampler:
        sum(i * i for i in range(300_000))
        time.sleep(0.2)
    assert len(sampler.samples) >= 2
    assert all(0 <= s.cpu_percent <= 100 * 64 and s.ram_gib > 0 for s in sampler.samples)
    assert sampler.samples[-1].seconds > sampler.samples[0].seconds


class NotSupported(Exception):
    """Stands in for pynvml.NVMLError_NotSupported."""


class MigNvml:
    """NVML as a MIG device answers it: memory is reported, utilisation is not."""

    @staticmethod
    def nvmlDeviceGetUtilizationRates(handle):
        raise NotSupported("Not Supported")

    @staticmethod
    def nvmlDeviceGetMemoryInfo(handle):
        return SimpleNamespace(used=3 * 2**30)


def test_a_reading_nvml_does_not_support_is_nan_and_sampling_goes_on(monkeypatch):
    monkeypatch.setattr(telemetry, "nvml_devices", lambda: (MigNvml, ["mig-0"]))
    with UtilisationSampler(interval_s=0.02) as sampler:
        time.sleep(0.15)
    assert len(sampler.samples) >= 3  # the thread kept sampling after the first failed reading
    assert all(math.isnan(s.gpu_percent[0]) and s.gpu_memory_gib == [3.0] for s in sampler.samples)
    page = utilisation_section(sampler.samples)
    assert "Not reported by NVML (as on MIG devices): GPU 0 %" in page
    assert "GPU 0 GiB" in page


def test_a_failing_sample_never_fails_the_task(monkeypatch):
    monkeypatch.setattr(telemetry, "nvml_devices", lambda: (MigNvml, ["mig-0"]))
    monkeypatch.setattr(telemetry.psutil, "virtual_memory", lambda: 1 / 0)
    with UtilisationSampler(interval_s=0.02) as sampler:  # __exit__ samples once more: it must not raise
        time.sleep(0.06)
    assert sampler.samples == []
