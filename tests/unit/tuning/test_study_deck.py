"""The study's Deck, drawn by best_trial: for a small finished study built here (no training), its
sections, the optimisation history, a panel per searched hyperparameter and the trials' learning curves
with their rung marks, each a drawn SVG."""

from __future__ import annotations

import json
import math
import re

import pytest

from tasks.core.evaluation import study_plots
from tasks.core.tuning.rungs import finish
from tasks.core.tuning.study import COMPLETED, DIVERGED, STOPPED, Study, TrialRecord, TuningSettings
from tasks.plumbing import study_deck

SPACE = {
    "learning_rate": {"low": 0.001, "high": 0.1, "log": True},
    "width": {"choices": [16, 32]},
    "lr_schedule": {"choices": ["cosine", "constant"]},
    "epochs": {"low": 1, "high": 3},
}
# (learning rate, width, schedule, metric after each rung, validation loss per epoch)
TRIALS = [
    (0.01, 32, "cosine", [0.8, 0.9], [0.5, 0.4, 0.3]),
    (0.002, 16, "constant", [0.7], [0.6]),
    (0.05, 16, "cosine", [0.6], [0.7]),
    (0.09, 32, "constant", [math.nan], [math.nan]),  # diverged: ranks last, drawn nowhere
]


def finished_study() -> Study:
    settings = TuningSettings(trials=4, concurrency=2, search_space=json.dumps(SPACE))
    study = Study(settings, "val_macro_f1", "maximize", [1, 3])
    for number, (rate, width, schedule, metrics, losses) in enumerate(TRIALS):
        values = {"learning_rate": rate, "width": width, "lr_schedule": schedule}
        study.trials.append(TrialRecord(number, {k: json.dumps(v) for k, v in values.items()}, "l4", 0.71))
        for rung, metric in enumerate(metrics):
            epochs = study.budgets[rung] - (study.budgets[rung - 1] if rung else 0)
            study.trial(number).add_rung(
                metric, losses[: study.budgets[rung]], 10.0 * epochs
            )  # 10 s an epoch
    return finish(study)


@pytest.fixture
def page(monkeypatch) -> str:
    pages: dict[str, str] = {}
    monkeypatch.setattr(study_deck, "Deck", lambda name, html: pages.__setitem__(name, html))
    study = finished_study()
    assert study.best == 0 and [t.state for t in study.trials] == [COMPLETED, STOPPED, STOPPED, DIVERGED]
    study_deck.study_deck(study)
    return pages["Study"]


def chart(page: str, name: str) -> str:
    """The chart's SVG, which must have something drawn."""
    match = re.search(
        rf'<figure class="chart" data-chart="{name}"><svg.*?</svg>\s*</figure>', page, re.DOTALL
    )
    assert match, f"chart {name} is missing or not an SVG"
    assert match.group(0).count("<path") > 2, f"chart {name} has nothing drawn"
    return match.group(0)


def test_the_study_deck_has_its_sections_and_a_chart_for_each_part(page):
    for title in (
        "Study",
        "Optimisation history",
        "Search space against the metric",
        "Learning curves",
        "Trials",
    ):
        assert f"<h2>{title}</h2>" in page, title
    names = re.findall(r'data-chart="([^"]+)"', page)
    assert names == ["history", "param-learning_rate", "param-width", "param-lr_schedule", "learning-curves"]


def test_the_history_shows_every_rung_and_rings_the_best_trial(page):
    history = chart(page, "history")  # matplotlib names each text it draws in a comment
    for label in ("rung 1 (1 epochs)", "rung 2 (3 epochs)", "best so far, rung 1", "best: trial 0"):
        assert f"<!-- {label} -->" in history, label


def test_a_panel_per_hyperparameter_on_its_own_scale(page, monkeypatch):
    for key in ("learning_rate", "width", "lr_schedule"):
        assert f"<!-- {key} -->" in chart(page, f"param-{key}"), key
    schedule = chart(page, "param-lr_schedule")
    assert "<!-- cosine -->" in schedule and "<!-- constant -->" in schedule  # choices as categories
    monkeypatch.setattr(study_plots, "to_svg", lambda figure: figure.axes[0])
    study = finished_study()
    assert study_plots.parameter_panel(study, "learning_rate").get_xscale() == "log"  # sampled so
    width = study_plots.parameter_panel(study, "width")  # choices: each one a category, in the space's order
    assert width.get_xscale() == "linear" and [t.get_text() for t in width.get_xticklabels()] == ["16", "32"]


def test_the_learning_curves_mark_where_the_rungs_ended(page):
    curves = chart(page, "learning-curves")
    for label in ("trial 0 (best)", "other trials", "rung ended"):
        assert f"<!-- {label} -->" in curves, label


def test_the_totals_and_a_row_per_trial(page):
    trials = page[page.index("<h2>Trials</h2>") :]
    assert trials.count("<tr>") == 1 + len(TRIALS)
    assert "<td>0.8, 0.9</td>" in trials and "<td>nan</td>" in trials
    # Trial 0 trained 3 epochs, the rest 1: 6 epochs of the 10 that every trial to the full budget costs, 40% saved
    # (trial 3 diverged in its first epoch, as its whole run would have).
    assert "<td>40%</td>" in page[: page.index("<h2>Optimisation history</h2>")]
    assert "<p>Best: trial 0, the best val_macro_f1, 0.9.</p>" in page


def test_best_trial_draws_its_deck():
    from tasks.tune import best_trial

    assert best_trial.enable_deck


def test_the_baseline_is_a_dashed_line_in_each_panel_and_named_in_its_row(monkeypatch):
    study = finished_study()
    study.trials.insert(0, TrialRecord(9, {}, "l4", 0.71, baseline=True))
    study.trial(9).add_rung(0.95, [0.2], 10.0)  # the best first rung: the sampler never saw it
    pages: dict[str, str] = {}
    monkeypatch.setattr(study_deck, "Deck", lambda name, html: pages.__setitem__(name, html))
    study_deck.study_deck(study)
    assert "<!-- base config -->" in chart(pages["Study"], "param-width")
    assert "<td>9 (base)</td>" in pages["Study"][pages["Study"].index("<h2>Trials</h2>") :]
    assert study_plots.best_so_far(study) == ([0, 1, 2], [0.8, 0.8, 0.8])
