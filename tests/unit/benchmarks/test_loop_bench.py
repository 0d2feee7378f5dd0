"""The DDP benchmark's arithmetic: each figure the median of its rounds' paired ratios with their
spread, the two halves of the rounds beside it, the CPU clock's rate, and tables large enough that
an epoch is mostly steady fast-path steps. Nothing here is timed."""

from __future__ import annotations

import pytest

from benchmarks.loop_bench import DDP_MODELS, CpuClock, fastest, halves, paired_figure
from tasks.core.data.split_config import SplitConfig
from tasks.core.training import torch_loop
from tasks.core.training.config import TrainConfig


def test_a_figure_is_the_median_of_its_rounds_ratios_with_their_spread():
    rates = {"project": [90.0, 100.0, 120.0], "bare DDP": [100.0, 100.0, 100.0]}
    figure = paired_figure("small", rates, "project")
    assert figure.ratio == pytest.approx(1.0) and figure.spread == "0.900-1.200"
    assert (figure.value, figure.baseline) == (100.0, 100.0)


def test_the_fastest_rounds_figure_compares_each_sides_fastest_round():
    rates = {"project": [90.0, 100.0, 120.0], "bare DDP": [100.0, 125.0, 110.0]}
    figure = paired_figure("small", fastest(rates), "project")
    assert figure.ratio == pytest.approx(120.0 / 125.0) and (figure.value, figure.baseline) == (120.0, 125.0)


def test_the_halves_are_the_medians_of_the_first_and_the_last_rounds():
    assert halves([1.0, 2.0, 3.0, 4.0, 5.0]) == (1.5, 4.0)
    assert halves([0.9]) == (0.9, 0.9)


def test_the_cpu_clock_gives_samples_per_cpu_second():
    clock = CpuClock()
    clock.add(2.0, 100)
    clock.add(3.0, 150)
    assert clock.rate() == 50.0


@pytest.mark.parametrize("name", list(DDP_MODELS))
def test_every_models_epoch_is_mostly_fast_path_steps(name):
    model, split = DDP_MODELS[name], SplitConfig()
    train_rows = int(model.rows * (1 - split.val_fraction - split.test_fraction))
    steps = TrainConfig(batch_size=model.batch_size).steps_per_epoch(train_rows // 2, world_size=2)
    assert steps >= 5 * torch_loop.GUARDED_STEPS
