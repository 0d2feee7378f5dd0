import pytest

from tasks.core.evaluation.compare import RunSummary, compare_runs
from tasks.core.training.config import TrainConfig
from tasks.core.training.records import Hardware, TrainingRun


def run(name, accelerator, count, seconds, accuracy):
    training = TrainingRun(
        "fw", "cuda", "dev", count, "nccl", "bf16", "s", [], 1000.0, seconds, TrainConfig()
    )
    return RunSummary(name, training, Hardware(accelerator, count), accuracy, accuracy)


def test_cost_is_accelerator_hours_times_price():
    gpu = run("gpu", "nvidia-h100", 8, 1800.0, 0.91)
    tpu = run("tpu", "tpu-v5-lite-podslice", 4, 3600.0, 0.93)
    comparison = compare_runs([gpu, tpu], {"nvidia-h100": 10.0, "tpu-v5-lite-podslice": 1.5})
    gpu_row, tpu_row = comparison.rows
    assert gpu_row.accelerator_hours == pytest.approx(4.0) and gpu_row.cost_usd == pytest.approx(40.0)
    assert tpu_row.accelerator_hours == pytest.approx(4.0) and tpu_row.cost_usd == pytest.approx(6.0)
    assert (comparison.most_accurate, comparison.fastest, comparison.cheapest) == ("tpu", "gpu", "tpu")
    assert "tpu" in comparison.table() and "40.000000" in comparison.table()


def test_missing_price_is_reported_not_guessed():
    comparison = compare_runs([run("gpu", "nvidia-b200", 1, 60.0, 0.9)], {"cpu": 0.04})
    assert comparison.rows[0].cost_usd is None and comparison.cheapest == "unknown"
    assert "no price for 'nvidia-b200'" in comparison.notes[0]


def test_nothing_to_compare():
    with pytest.raises(ValueError, match="nothing to compare"):
        compare_runs([], {})


def test_what_pyflyte_prints_of_a_comparison_is_its_table():
    comparison = compare_runs([run("gpu", "nvidia-b200", 1, 60.0, 0.9)], {"nvidia-b200": 5.0})
    assert repr(comparison) == f"\n{comparison.table()}\n"
    assert "TrainingRun(" not in repr(comparison) and len(repr(comparison)) < 600


def test_regression_runs_compare_by_their_own_metric(monkeypatch):
    from tasks.plumbing import decks

    def regression_run(name, seconds, rmse, r2):
        training = TrainingRun(
            "fw", "cuda", "dev", 1, "nccl", "bf16", "s", [], 1000.0, seconds, TrainConfig()
        )
        return RunSummary(name, training, Hardware("cpu", 1), 0.0, 0.0, rmse, r2)

    runs = [regression_run("gpu", 60.0, 55.0, 0.45), regression_run("tpu", 30.0, 60.0, 0.38)]
    comparison = compare_runs(runs, {"cpu": 0.04})
    assert comparison.regression and comparison.most_accurate == "gpu" and comparison.fastest == "tpu"
    table = comparison.table()
    assert "RMSE" in table and "R²" in table and "best R²: gpu" in table and "accuracy" not in table
    pages = {}
    monkeypatch.setattr(decks, "Deck", lambda name, html: pages.__setitem__(name, html))
    decks.comparison_deck(comparison)
    assert "R²" in pages["Comparison"] and "macro-F1" not in pages["Comparison"]
