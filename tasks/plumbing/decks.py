"""The Flyte Decks: one HTML page per task, with real charts (inline SVG) and tables."""

from __future__ import annotations

import html
import math
from typing import TYPE_CHECKING

import numpy as np
from flytekit import Deck
from flytekit.deck import DeckField

from tasks.core.evaluation import plots

if TYPE_CHECKING:
    from tasks.core.data.prepare import PreparedTable

# flytekit's default Decks without "Dependencies": that one runs `pip list` and `pip freeze` in
# subprocesses for every task (about a second each), and the images pin every package anyway.
DECK_FIELDS = (DeckField.SOURCE_CODE, DeckField.TIMELINE, DeckField.INPUT, DeckField.OUTPUT)
DECKS = {"enable_deck": True, "deck_fields": DECK_FIELDS}  # every task's Deck options


def table(header: list[str], rows: list[list]) -> str:
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(fmt(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f'<table class="mixedml"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def fmt(value) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


STYLE = (
    "<style>table.mixedml{border-collapse:collapse;margin:8px 0}"
    "table.mixedml td,table.mixedml th{padding:3px 10px;border-bottom:1px solid #ddd;text-align:right}"
    "figure.chart{margin:8px 0}</style>"
)


def section(title: str, *parts: str) -> str:
    return f"{STYLE}<section><h2>{html.escape(title)}</h2>{''.join(parts)}</section>"


def figure(svg: str, name: str) -> str:
    return f'<figure class="chart" data-chart="{name}">{svg}</figure>'


def column_rows(prepared: PreparedTable) -> list[list]:
    """What preprocessing decided for each input column: its kind, the columns the model reads from it,
    its vocabulary, the share of train rows missing it; or why it was left out."""
    from tasks.core.data.kind_records import RECORDS

    if not prepared.encoding:  # prepared before encodings: every feature a number, read as it is
        return [[name, "numeric", 1, "", "0.0%", ""] for name in prepared.feature_names]
    encoding = prepared.fitted_encoding()
    rows = []
    for column in encoding.columns:
        encoder = column.encoder
        vocabulary = RECORDS[column.kind].deck_vocabulary(encoder)
        missing = f"{column.missing_share:.1%}"
        rows.append([column.name, column.kind, len(encoder.names(column.name)), vocabulary, missing, ""])
    rows += [[name, "left out", 0, "", "", why] for name, why in encoding.left_out.items()]
    return rows


def dataset_profile_deck(prepared: PreparedTable) -> None:
    features, scaler = prepared.feature_names, prepared.scaler
    shown = features[:20]
    content = section(
        "Dataset",
        table(["source", "rows", "features", "classes"],
              [[prepared.source, sum(prepared.rows.values()), len(features), len(prepared.class_labels)]]),
        table(["split", "rows"], [[name, rows] for name, rows in prepared.rows.items()]),
    ) + section(
        "Columns (as preprocessing read them)",
        table(["column", "kind", "model inputs", "vocabulary", "missing in train", "why left out"],
              column_rows(prepared)),
        table(["note"], [[note] for note in prepared.notes]) if prepared.notes else "",
    ) + section(
        "Class balance",
        figure(plots.bar_chart(list(prepared.class_counts), list(prepared.class_counts.values()),
                               "rows per class", "rows"), "class-balance"),
    ) + section(
        "Feature statistics (training split, before standardisation)",
        figure(plots.line_chart({"mean": (shown, scaler.mean[:20]), "std": (shown, scaler.scale[:20])},
                                "first 20 features", "feature", "value"), "feature-stats"),
        table(["feature", "mean", "std"],
              [[f, m, s] for f, m, s in zip(features, scaler.mean, scaler.scale, strict=True)]),
    )  # fmt: skip
    Deck("Dataset profile", content)


def training_deck(trained, samples: list) -> None:
    """`samples`: the `telemetry.Sample`s taken while training."""
    run = trained.run
    run_table = section(
        "Run",
        table(["framework", "strategy", "device", "workers", "precision", "samples/s", "train s", "peak device GiB",
               "declared hardware"],
              [[run.framework, run.strategy, run.device_name, run.world_size, run.precision, run.samples_per_second,
                run.train_seconds, run.peak_device_memory_bytes / 2**30, trained.declared.describe()]]),
    )  # fmt: skip
    Deck("Training", learning_curves(run.history, run.regression) + run_table + utilisation_section(samples))


def learning_curves(history: list, regression: bool = False) -> str:
    """Loss and accuracy per epoch (`config.EpochMetrics`): a table, and charts from two epochs on,
    since one epoch is a point, not a curve. A regression has a loss alone, a squared error."""
    curves = REGRESSION_CURVES if regression else CURVES
    columns = ["epoch", *(f"{split} {metric}" for metric, _ in curves for split in ("train", "val"))]
    rows = [[e.epoch, *(getattr(e, f"{split}_{metric}") for metric, _ in curves for split in ("train", "val"))]
            for e in history]  # fmt: skip
    per_epoch = table(columns, rows)
    if len(history) < 2:
        return section("Learning curves", per_epoch)
    charts = [figure(curve(history, metric, unit), metric) for metric, unit in curves]
    return section("Learning curves", *charts, per_epoch)


CURVES = [("loss", "cross-entropy"), ("accuracy", "accuracy")]  # EpochMetrics' train_/val_ fields, y label
REGRESSION_CURVES = [("loss", "squared error of the standardised label")]


def curve(history: list, metric: str, unit: str) -> str:
    epochs = [e.epoch for e in history]
    series = {
        split: (epochs, [getattr(e, f"{split}_{metric}") for e in history]) for split in ("train", "val")
    }
    return plots.line_chart(series, metric, "epoch", unit)


def utilisation_section(samples: list) -> str:
    if not samples:
        return section("Utilisation", "<p>no samples</p>")
    seconds = [s.seconds for s in samples]
    series = {"CPU %": (seconds, [s.cpu_percent for s in samples])}
    memory = {"RAM GiB": (seconds, [s.ram_gib for s in samples])}
    unreported = []
    for gpu in range(len(samples[0].gpu_percent)):
        for name, values, chart in (
            (f"GPU {gpu} %", [s.gpu_percent[gpu] for s in samples], series),
            (f"GPU {gpu} GiB", [s.gpu_memory_gib[gpu] for s in samples], memory),
        ):
            points = [(t, v) for t, v in zip(seconds, values, strict=True) if math.isfinite(v)]
            if points:
                chart[name] = tuple(map(list, zip(*points, strict=True)))
            else:
                unreported.append(name)
    note = "" if samples[0].gpu_percent else "<p>No GPU was visible (NVML); CPU and RAM only.</p>"
    if unreported:
        note += f"<p>Not reported by NVML (as on MIG devices): {html.escape(', '.join(unreported))}.</p>"
    return section(
        "Utilisation",
        note,
        figure(plots.line_chart(series, "utilisation", "seconds", "%"), "utilisation"),
        figure(plots.line_chart(memory, "memory in use", "seconds", "GiB"), "memory"),
    )


def billed_section(report) -> str:
    """The hardware that ran and its price: the applied plan's, or the declaration when none was applied."""
    billed = report.billed
    price = f"${billed.price_per_hour:.2f}/h per device" if billed.price_per_hour is not None else "n/a"
    plan = report.resource_plan
    state = "no plan" if plan is None else ("applied" if plan.applied else "not applied")
    return section(
        "Hardware billed",
        table(["accelerator", "partition", "count", "price", "resource plan"],
              [[billed.accelerator, billed.partition or "-", billed.count, price, state]]),
    )  # fmt: skip


def evaluation_deck(report, points=None) -> None:
    """`points`: a regression's test rows (actual, predicted), for its charts."""
    if report.regression is not None:
        regression_deck(report, points)
        return
    metrics, run = report.metrics, report.training
    per_class = [[c.label, c.precision, c.recall, c.f1, c.support, c.predicted] for c in metrics.per_class]
    content = section(
        "Test metrics",
        table(["accuracy", "macro-F1", "test rows", "trained with", "on"],
              [[metrics.accuracy, metrics.macro_f1, metrics.n_test, run.framework, run.device_name]]),
        "".join(f"<p>{html.escape(note)}</p>" for note in report.notes),
    ) + billed_section(report) + section(
        "Confusion matrix",
        figure(plots.heatmap(metrics.confusion_matrix, report.class_labels, "confusion matrix"), "confusion-matrix"),
        table(["true class", "predicted as", "test rows"],
              [list(pair) for pair in plots.top_confusions(metrics.confusion_matrix, report.class_labels)]),
    ) + section(
        "Per class",
        figure(plots.line_chart({name: (report.class_labels, [c[i] for c in per_class])
                                 for i, name in ((1, "precision"), (2, "recall"), (3, "F1"))},
                                "per-class metrics", "class", "score"), "per-class"),
        table(["class", "precision", "recall", "F1", "support", "predicted"], per_class),
    )  # fmt: skip
    Deck("Evaluation", content)


def regression_deck(report, points=None) -> None:
    metrics, run = report.regression, report.training
    content = section(
        "Test metrics (regression)",
        table(["", "RMSE", "MAE", "R²", "test rows"],
              [["model", metrics.rmse, metrics.mae, metrics.r2, metrics.n_test],
               ["train mean", metrics.baseline_rmse, metrics.baseline_mae, metrics.baseline_r2, metrics.n_test]]),
        table(["trained with", "on"], [[run.framework, run.device_name]]),
        "".join(f"<p>{html.escape(note)}</p>" for note in [report.target.describe(), *report.notes]),
    ) + billed_section(report)  # fmt: skip
    if points is not None:
        actual, predicted = points
        finite = np.isfinite(predicted)
        content += section(
            "Predictions",
            figure(plots.predicted_against_actual(actual[finite], predicted[finite], "label"), "predicted-vs-actual"),
            figure(plots.residuals(actual[finite], predicted[finite], "label"), "residuals"),
        )  # fmt: skip
    Deck("Evaluation", content)


def run_quality(run, regression: bool) -> list[float]:
    return [run.rmse, run.r2] if regression else [run.accuracy, run.macro_f1]


def comparison_deck(comparison) -> None:
    names = [row.run.name for row in comparison.rows]
    quality = ["RMSE", "R²"] if comparison.regression else ["accuracy", "macro-F1"]
    rows = [[r.run.name, r.hardware(), *run_quality(r.run, comparison.regression), r.run.training.train_seconds,
             r.run.training.samples_per_second, r.price_per_hour if r.price_per_hour is not None else "n/a",
             r.cost_usd if r.cost_usd is not None else "n/a"]
            for r in comparison.rows]  # fmt: skip
    content = section(
        "GPU against TPU",
        table(["run", "hardware", *quality, "train s", "samples/s", "$/h per device", "cost $"], rows),
        figure(
            plots.bar_chart(names, [r.run.score for r in comparison.rows], quality[-1 if comparison.regression else 0],
                            quality[-1 if comparison.regression else 0]),
            "accuracy",
        ),
        figure(
            plots.bar_chart(
                names, [r.run.training.train_seconds for r in comparison.rows], "training time", "s"
            ),
            "time",
        ),
        figure(
            plots.bar_chart(names, [r.cost_usd or 0.0 for r in comparison.rows], "estimated cost", "USD"),
            "cost",
        ),
        "".join(f"<p>{html.escape(note)}</p>" for note in comparison.notes),
    )  # fmt: skip
    Deck("Comparison", content)
