"""The tuning study's Deck, drawn by the task that finishes the study (tasks/tune.py, best_trial): its
totals, the optimisation history, each searched hyperparameter against the metric, each trial's learning
curve with its rung marks, and a row per trial. Sections, tables and charts as the other Decks'
(tasks/plumbing/decks.py)."""

from __future__ import annotations

from html import escape

from flytekit import Deck

from tasks.core.evaluation import study_plots
from tasks.plumbing.decks import figure, section, table

PANEL_ROW = '<div style="display:flex;flex-wrap:wrap;gap:8px">{}</div>'


def study_deck(study) -> None:
    """`study`: a finished `tasks.core.tuning.study.Study`."""
    Deck("Study", study_page(study))


def study_page(study) -> str:
    keys = study_plots.searched_keys(study)
    panels = [figure(study_plots.parameter_panel(study, key), f"param-{key}") for key in keys]
    return (
        section("Study", totals(study) + f"<p>Best: trial {study.best}, {escape(study.choice)}.</p>")
        + section("Optimisation history", figure(study_plots.optimisation_history(study), "history"))
        + section(
            "Search space against the metric",
            "<p>Each trial's metric after the first rung, which every trial trained, by the value it tried; "
            "colour: the furthest rung it reached; ringed: the best trial; dashed: trial 0, the base "
            "configuration, which trains every rung as the reference the best must beat.</p>",
            PANEL_ROW.format("".join(panels)) if panels else "<p>nothing was searched</p>",
        )
        + section(
            "Learning curves",
            "<p>Validation loss per epoch; dotted: the rungs' budgets; a mark where a trial's rung ended.</p>",
            figure(study_plots.trial_curves(study), "learning-curves"),
        )
        + section("Trials", trials_table(study, keys))
    )


def totals(study) -> str:
    best = study.trial(study.best) if study.best >= 0 else None
    saved = 1 - study.cost_usd / study.full_budget_cost_usd if study.full_budget_cost_usd > 0 else 0.0
    return table(
        ["trials", "rungs (epochs)", "metric", "best trial", "its metric", "train s", "cost $",
         "every trial to the full budget $", "saved"],
        [[len(study.trials), ", ".join(map(str, study.budgets)), f"{study.metric} ({study.direction})",
          study.best, best.rung_metrics[-1] if best and best.rung_metrics else "n/a", study.wall_seconds,
          f"{study.cost_usd:.6f}", f"{study.full_budget_cost_usd:.6f}", f"{saved:.0%}"]],
    )  # fmt: skip


def trials_table(study, keys: list[str]) -> str:
    rows = [
        [t.label, t.state, *(t.params.get(key, "") for key in keys), t.hardware,
         t.price_per_hour, t.epochs_trained, ", ".join(f"{m:.4g}" for m in t.rung_metrics), t.wall_seconds,
         f"{t.cost_usd:.6f}"]
        for t in study.trials
    ]  # fmt: skip
    header = [
        "trial",
        "state",
        *keys,
        "hardware",
        "$/h",
        "epochs",
        f"{study.metric} by rung",
        "train s",
        "cost $",
    ]
    return table(header, rows)
