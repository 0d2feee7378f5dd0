"""A tuning study's charts for its Deck (tasks/plumbing/study_deck.py), as inline SVG drawn as the other
Decks' charts are (tasks/core/evaluation/plots.py): the optimisation history, each searched
hyperparameter against the metric, and each trial's learning curve with its rung marks."""

from __future__ import annotations

import json
import math

from tasks.core.evaluation.plots import MARKER_LIMIT, new_axes, set_category_ticks, set_labels, to_svg
from tasks.core.tuning.space import space_json
from tasks.core.tuning.study import Study, TrialRecord, sort_value

BEST, OTHERS = "#c44e52", "#8c8c8c"  # the best trial's colour, and the rest's
RUNG_COLOURS = ("#4c72b0", "#dd8452", "#55a868", "#8172b3", "#937860", "#da8bc3")


def rung_name(study: Study, rung: int) -> str:
    return f"rung {rung + 1} ({study.budgets[rung]} epochs)"


def reached(study: Study, rung: int) -> list[TrialRecord]:
    """The trials with a finite metric after `rung`."""
    return [t for t in study.trials if len(t.rung_metrics) > rung and math.isfinite(t.rung_metrics[rung])]


def best_so_far(study: Study) -> tuple[list[int], list[float]]:
    """After each proposed trial (in proposal order), the best first-rung metric so far: what the sampler
    saw (it is not told the baseline)."""
    numbers, values, best = [], [], math.nan
    for trial in (t for t in reached(study, 0) if not t.baseline):
        value = trial.rung_metrics[0]
        if math.isnan(best) or sort_value(value, study.direction) < sort_value(best, study.direction):
            best = value
        numbers.append(trial.number)
        values.append(best)
    return numbers, values


def optimisation_history(study: Study) -> str:
    """Each trial's metric after every rung it reached, by trial number, and the best after the first
    rung so far; the study's best trial ringed."""
    figure, axes = new_axes((6, 3.2))
    for rung in range(len(study.budgets)):
        trials = reached(study, rung)
        if trials:
            axes.scatter([t.number for t in trials], [t.rung_metrics[rung] for t in trials], s=18,
                         color=RUNG_COLOURS[rung % len(RUNG_COLOURS)], label=rung_name(study, rung))  # fmt: skip
    numbers, values = best_so_far(study)
    if numbers:
        axes.step(numbers, values, where="post", color=OTHERS, linewidth=1, label="best so far, rung 1")
    best = [t for t in study.trials if t.number == study.best and t.rung_metrics]
    if best and math.isfinite(best[0].rung_metrics[-1]):
        axes.scatter([study.best], [best[0].rung_metrics[-1]], s=90, facecolors="none", edgecolors=BEST,
                     linewidths=1.5, label=f"best: trial {study.best}")  # fmt: skip
    integer_ticks(axes.xaxis)
    set_labels(axes, f"optimisation history ({study.direction})", "trial", study.metric)
    axes.grid(alpha=0.3)
    legend(axes, "small")
    return to_svg(figure)


def integer_ticks(axis) -> None:
    """Ticks at whole numbers only: trials and epochs."""
    from matplotlib.ticker import MaxNLocator

    axis.set_major_locator(MaxNLocator(integer=True))


def legend(axes, size: str) -> None:
    """A legend of the labelled artists, where there are any (a study of no finite metric has none)."""
    if axes.get_legend_handles_labels()[0]:
        axes.legend(fontsize=size)


def searched_keys(study: Study) -> list[str]:
    """The searched hyperparameters, in the order the trials name them."""
    return list(dict.fromkeys(key for trial in study.trials for key in trial.params))


def space_spec(study: Study, key: str) -> dict:
    spec = space_json(study.settings.search_space).get(key)
    return spec if isinstance(spec, dict) else {}


def categories_of(study: Study, key: str, values: list) -> dict[str, int]:
    """Each value's position where `key` is a list of choices (in the space's order) or its values are
    not all numbers (in the order first proposed); empty for a range of numbers."""
    spec = space_spec(study, key)
    if "choices" in spec:
        shown = [json.dumps(choice) for choice in spec["choices"]]
    elif all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
        return {}
    else:
        shown = []
    shown += [json.dumps(value) for value in values]
    return {name: i for i, name in enumerate(dict.fromkeys(shown))}


def parameter_panel(study: Study, key: str) -> str:
    """Every trial's value of `key` against its first-rung metric (every trial has one, measured alike),
    coloured by the furthest rung it reached; the best trial ringed, the base configuration's metric
    dashed. A range is a numeric axis (logarithmic where the space samples it so), choices are
    categories."""
    figure, axes = new_axes((3.6, 2.8))
    trials = [t for t in reached(study, 0) if key in t.params]
    values = [t.values()[key] for t in trials]
    categories = categories_of(study, key, values)
    xs = [categories[json.dumps(value)] for value in values] if categories else values
    for rung in range(len(study.budgets)):
        shown = [
            (x, t.rung_metrics[0]) for x, t in zip(xs, trials, strict=True) if len(t.rung_metrics) == rung + 1
        ]
        if shown:
            axes.scatter(*zip(*shown, strict=True), s=18, color=RUNG_COLOURS[rung % len(RUNG_COLOURS)],
                         label=f"reached rung {rung + 1}")  # fmt: skip
    best = [(x, t.rung_metrics[0]) for x, t in zip(xs, trials, strict=True) if t.number == study.best]
    if best:
        axes.scatter(*zip(*best, strict=True), s=90, facecolors="none", edgecolors=BEST, linewidths=1.5)
    for baseline in (t for t in reached(study, 0) if t.baseline):
        axes.axhline(baseline.rung_metrics[0], color=OTHERS, linestyle="--", linewidth=1, label="base config")
    if categories:
        set_category_ticks(axes.xaxis, [name.strip('"') for name in categories])
        axes.set_xlim(-0.5, len(categories) - 0.5)
    elif space_spec(study, key).get("log") and values and min(values) > 0:
        from matplotlib.ticker import FuncFormatter, NullFormatter

        axes.set_xscale("log")
        # Decades labelled as plain numbers (0.01), the ticks between them not: plain text is what the
        # margins are measured for (tasks/core/evaluation/plots.py, fit_margins).
        axes.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
        axes.xaxis.set_minor_formatter(NullFormatter())
    set_labels(axes, key, key, f"{study.metric}, rung 1")
    axes.grid(alpha=0.3)
    legend(axes, "x-small")
    return to_svg(figure)


def trial_curves(study: Study) -> str:
    """Each trial's validation loss per epoch, the best trial's in colour; a mark where each of its rungs
    ended, and a dotted line at every rung's budget."""
    figure, axes = new_axes((6, 3.2))
    for budget in study.budgets:
        axes.axvline(budget, color=OTHERS, linestyle=":", linewidth=0.8)
    unlabelled = {"other trials", "rung ended"}  # legend entries drawn once
    for trial in sorted(study.trials, key=lambda t: t.number == study.best):  # the best drawn last, on top
        if trial.val_losses:
            draw_trial(axes, study, trial, unlabelled)
    integer_ticks(axes.xaxis)
    set_labels(axes, "learning curves", "epoch", "validation loss")
    axes.grid(alpha=0.3)
    legend(axes, "small")
    return to_svg(figure)


def draw_trial(axes, study: Study, trial: TrialRecord, unlabelled: set[str]) -> None:
    """One trial's curve and its rung marks; `unlabelled`: the legend entries not drawn yet."""

    def once(label: str) -> str | None:
        if label not in unlabelled:
            return None
        unlabelled.discard(label)
        return label

    best = trial.number == study.best
    epochs = list(range(1, len(trial.val_losses) + 1))
    axes.plot(epochs, trial.val_losses, color=BEST if best else OTHERS, linewidth=1.6 if best else 0.8,
              alpha=1.0 if best else 0.6, label=f"trial {trial.number} (best)" if best else once("other trials"),
              marker="o" if len(epochs) < MARKER_LIMIT else None, markersize=3 if best else 2)  # fmt: skip
    ends = [b for b in study.budgets[: len(trial.rung_metrics)] if b <= len(trial.val_losses)]
    if ends:
        axes.scatter(ends, [trial.val_losses[b - 1] for b in ends], marker="|", s=80, color="black", zorder=3,
                     label=once("rung ended"))  # fmt: skip
