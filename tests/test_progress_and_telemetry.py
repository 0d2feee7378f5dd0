from __future__ import annotations

import io
import logging
import time

from tasks.core.progress import ProgressReporter
from tasks.core.telemetry import UtilisationSampler


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
    logger, collect = logging.getLogger("tasks.core.progress"), Collect()
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
