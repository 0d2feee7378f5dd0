"""Tuning: a study's best trial against the default configuration and gradient boosting, and successive
halving against every trial trained to the whole budget.

`python -m benchmarks --only tuning` runs a study in this process, without Flyte, on the tables group's
four tables (fewer rows) and two public tables that installed packages ship (nothing is downloaded):
scikit-learn's breast cancer table, written as CSV, and vega's cars table (label `Origin`; its columns'
kinds are inferred, as a user's run infers them: its `Name` column is text, whose words the pipeline
reads and HistGradientBoosting cannot, so it reads the names as categories). The study is the tuning workflow's: its rounds
(`rungs.next_round`), Optuna's seeded proposals and each trial's config (`tuning.rounds`), the trial's
metric on the validation split (`scoring.trial_metric`); each trial is the torch loop in this process, a
promoted trial resumed from its own checkpoint.

Per table, on the split `prepare_dataset` made (seed 0): the test accuracy (a regression's test R²) of
HistGradientBoosting on the same train rows, of the default `TrainConfig`, and of the study's best trial
scored through its model bundle; then the same proposed trials each trained to the whole budget (the
full-budget sweep): the trial-epochs and the measured training seconds of both, and the best trial's
test score of each.
"""

from __future__ import annotations

import importlib.resources
import json
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq

from benchmarks import tables
from benchmarks.measure import Figure
from tasks.core.data.prepare import PreparedSplits, prepare_dataset
from tasks.core.training.config import TrainConfig
from tasks.core.training.records import TrainingRun
from tasks.core.tuning.study import Study, TrialRecord, TuningSettings

# Each table is split three ways (the split's seed): on a test split of 66 to 300 rows one split's ratio
# moves by several hundredths, so the goals are judged on the means over the splits too.
FULL = {
    "rows": 2_000,
    "trials": 16,
    "space": "",
    "default_epochs": TrainConfig.epochs,
    "split_seeds": (0, 1, 2),
}
# A study of 3 trials over rungs of 1 and 3 epochs, batches that fit the smallest train split.
SMOKE_SPACE = {"learning_rate": {"low": 1e-3, "high": 1e-2, "log": True}, "batch_size": {"choices": [32, 64]},
               "width": {"choices": [16, 32]}, "epochs": {"low": 1, "high": 3}}  # fmt: skip
SMOKE = {"rows": 600, "trials": 3, "space": json.dumps(SMOKE_SPACE), "default_epochs": 2, "split_seeds": (0,)}
# Each trial is priced alike, so the study's cost is its training seconds in a common unit.
PRICE_PER_HOUR = 1.0
GOAL_HGB, GOAL_EPOCHS, GOAL_SAME_BEST = 0.98, 0.5, 0.99
# A split's figures averaged over the splits: (its place among them, what the tuned score is against,
# the least ratio that meets the goal).
MEANS = ((0, "HistGradientBoosting", GOAL_HGB), (1, "the default configuration", 1.0))


def write_breast_cancer(path: str, rows: int = 0) -> str:
    """scikit-learn's bundled breast cancer table as CSV (569 rows, 30 numbers), whatever `rows` asks."""
    from sklearn.datasets import load_breast_cancer

    bundled = load_breast_cancer(as_frame=True)
    frame = bundled.frame.drop(columns="target")
    frame[tables.LABEL] = np.asarray(bundled.target_names)[bundled.target]  # malignant or benign
    pcsv.write_csv(pa.Table.from_pandas(frame, preserve_index=False), path)
    return path


def write_cars(path: str, rows: int = 0) -> str:
    """vega's cars table as parquet (406 rows: the name, numbers with gaps, the model year as ISO text and
    the origin), read from the installed package, whatever `rows` asks."""
    raw = importlib.resources.files("vega_datasets") / "_data" / "cars.json"
    pq.write_table(pa.Table.from_pylist(json.loads(raw.read_text())), path)
    return path


# name: (file, writer, label column)
TABLES = {
    **{name: (file, write, tables.LABEL) for name, (file, write) in tables.TABLES.items()},
    **{name: (file, write, tables.LABEL) for name, (file, write) in tables.REGRESSION_TABLES.items()},
    "breast_cancer": ("breast_cancer.csv", write_breast_cancer, tables.LABEL),
    "cars": ("cars.parquet", write_cars, "Origin"),
}


@dataclass
class Table:
    name: str
    data: str
    label: str
    prepared: PreparedSplits
    folder: Path
    split_seed: int

    @property
    def regression(self) -> bool:
        return self.prepared.table.target.regression

    @property
    def score_name(self) -> str:
        return "test R²" if self.regression else "test accuracy"

    def describe(self) -> str:
        rows = self.prepared.table.rows
        return (f"{self.name} ({Path(self.data).name}, {sum(rows.values()):,} rows: {rows['train']:,} train, "
                f"{rows['val']:,} val, {rows['test']:,} test; split seed {self.split_seed})")  # fmt: skip


@dataclass
class Sweep:
    """Trials trained: their records (each run's metric as its last rung's), the best one's test score,
    the trial-epochs and the training seconds."""

    records: list[TrialRecord]
    best: int
    test_score: float

    @property
    def epochs(self) -> int:
        return sum(record.epochs_trained for record in self.records)

    @property
    def seconds(self) -> float:
        return sum(record.wall_seconds for record in self.records)


def open_table(work: Path, name: str, rows: int, split_seed: int = 0) -> Table:
    file, write, label = TABLES[name]
    folder = work / f"tuning-{name}-split-{split_seed}"
    folder.mkdir()
    data = write(str(folder / file), rows)
    split = replace(tables.SPLIT, seed=split_seed)
    prepared = prepare_dataset(data, label, str(folder / "prepared"), split)
    return Table(name, data, label, prepared, folder, split_seed)


def test_score(table: Table, artifact: str, run: TrainingRun, name: str) -> float:
    """The model at `artifact` scored through its bundle on the raw test split: accuracy, or R²."""
    from sklearn.metrics import r2_score

    from tasks.core.bundle.loading import load_bundle
    from tasks.core.bundle.manifest import BundleRecord
    from tasks.core.bundle.writing import write_bundle
    from tasks.core.evaluation.metrics import classification_metrics
    from tasks.core.training.records import Hardware

    record = BundleRecord.of(table.prepared.table, run, Hardware("cpu", 1), data_fingerprint="")
    bundle = load_bundle(write_bundle(str(table.folder / f"bundle-{name}"), artifact, record))
    test = pq.read_table(table.prepared.paths["test"])
    truth = test.column(table.label).to_numpy()
    if table.regression:
        return float(r2_score(truth, bundle.predict_numbers(test)))
    labels = table.prepared.table.class_labels
    return classification_metrics(truth, bundle.predict_codes(test), labels).accuracy


def default_score(table: Table, base: TrainConfig) -> float:
    """The default configuration (as a user's first run trains it), scored on the test split."""
    from tasks.core.training.torch_training import train

    artifact = str(table.folder / "default.pt")
    run = train(base, table.prepared.split_paths(), artifact).run
    return test_score(table, artifact, run, "default")


def trained_trial(
    table: Table, study: Study, record: TrialRecord, config: TrainConfig, folder: Path
) -> TrainingRun:
    """One run of a trial in this process, resumed from the checkpoint in `folder` where it stopped at an
    earlier rung; its metric and seconds go into `record`."""
    from tasks.core.training.checkpoint import TrainingCheckpoint
    from tasks.core.training.torch_training import train
    from tasks.core.tuning.rounds import record_rung
    from tasks.core.tuning.scoring import trial_metric

    record.hardware, record.price_per_hour = "cpu (this machine)", PRICE_PER_HOUR
    folder.mkdir(exist_ok=True)
    splits, artifact = table.prepared.split_paths(), str(folder / "model.pt")
    checkpoint = TrainingCheckpoint(str(folder / "checkpoint")) if config.train_until_epoch else None
    run = train(config, splits, artifact, checkpoint).run
    record_rung(
        record,
        trial_metric(study.metric, lambda: artifact, splits, run, table.prepared.table.target.std),
        run,
    )
    return run


def halving(table: Table, base: TrainConfig, settings: TuningSettings) -> tuple[Study, Sweep]:
    """The study as the tuning workflow runs it, round after round, in this process."""
    from tasks.core.tuning.rounds import open_study, round_configs
    from tasks.core.tuning.rungs import finish, next_round

    study, runs = open_study(settings, base, table.regression, table.prepared.table.rows["val"]), {}
    while (work := next_round(study)) is not None:
        for number, config in round_configs(study, work, base):
            runs[number] = trained_trial(
                table, study, study.trial(number), config, table.folder / f"trial-{number}"
            )
    finish(study)
    best = str(table.folder / f"trial-{study.best}" / "model.pt")
    return study, Sweep(study.trials, study.best, test_score(table, best, runs[study.best], "tuned"))


def full_budget(table: Table, base: TrainConfig, study: Study) -> Sweep:
    """The study's trials, the same values, each trained to the whole budget in one run."""
    from tasks.core.tuning.rounds import whole_config
    from tasks.core.tuning.rungs import best_of

    records, runs = [], {}
    for trial in study.trials:
        record = TrialRecord(trial.number, trial.params, baseline=trial.baseline)
        config = whole_config(base, trial, study.budgets[-1])
        runs[record.number] = trained_trial(
            table, study, record, config, table.folder / f"full-{record.number}"
        )
        records.append(record)
    swept = Study(study.settings, study.metric, study.direction, study.budgets[-1:], records, study.val_rows)
    best = best_of(swept)[0]  # as the study chooses: the baseline unless beaten beyond one standard error
    artifact = str(table.folder / f"full-{best}" / "model.pt")
    return Sweep(records, best, test_score(table, artifact, runs[best], "full-budget"))


def verdict(met: bool) -> str:
    return "met" if met else "missed"


def table_figures(table: Table, hgb: float, default: float, tuned: Sweep, full: Sweep) -> list[Figure]:
    """The table's figures on one split, each goal marked met or missed."""
    name, score = f"tuning: {table.name} (split seed {table.split_seed})", table.score_name
    tuned_hgb, tuned_default = tuned.test_score / hgb, tuned.test_score / default
    epochs, seconds = tuned.epochs / full.epochs, tuned.seconds / full.seconds
    same_best = tuned.test_score / full.test_score
    return [
        Figure(f"{name} {score}, tuned (best trial {tuned.best}) vs HistGradientBoosting, same split",
               tuned.test_score, hgb, "", f"ratio >= {GOAL_HGB}: {verdict(tuned_hgb >= GOAL_HGB)}"),
        Figure(f"{name} {score}, tuned vs the default configuration", tuned.test_score, default, "",
               f"ratio >= 1 (never below): {verdict(tuned_default >= 1)}"),
        Figure(f"{name} trial-epochs, successive halving vs every trial to the full budget", tuned.epochs,
               full.epochs, "epochs", f"ratio <= {GOAL_EPOCHS}: {verdict(epochs <= GOAL_EPOCHS)}"),
        Figure(f"{name} training seconds (cost, measured), successive halving vs the full-budget sweep",
               tuned.seconds, full.seconds, "s", f"ratio <= {GOAL_EPOCHS}: {verdict(seconds <= GOAL_EPOCHS)}"),
        Figure(f"{name} {score} of the best trial, successive halving (trial {tuned.best}) vs the full-budget "
               f"sweep (trial {full.best})", tuned.test_score, full.test_score, "",
               f"ratio >= {GOAL_SAME_BEST} (the same best score): {verdict(same_best >= GOAL_SAME_BEST)}"),
    ]  # fmt: skip


def print_table(table: Table, study: Study, hgb: float, default: float, figures: list[Figure]) -> None:
    """The table's block: the scores, then each comparison as a ratio with its goal."""
    tuned, versus_default, epochs, seconds, same = figures
    print(f"\n{table.describe()}: {table.score_name}; study of {len(study.trials)} trials, rungs at "
          f"{study.budgets} epochs, ranked by {study.metric}\n"
          "| figure | value | baseline | ratio | goal |\n|---|---|---|---|---|\n"
          f"| HistGradientBoosting | {hgb:.3f} | | | |\n"
          f"| default configuration | {default:.3f} | | | |\n"
          f"| tuned vs HistGradientBoosting | {tuned.value:.3f} | {hgb:.3f} | {tuned.ratio:.3f} | {tuned.goal} |\n"
          f"| tuned vs default | {tuned.value:.3f} | {default:.3f} | {versus_default.ratio:.3f} | "
          f"{versus_default.goal} |\n"
          f"| trial-epochs vs full budget | {epochs.value:.0f} | {epochs.baseline:.0f} | {epochs.ratio:.3f} | "
          f"{epochs.goal} |\n"
          f"| cost (training seconds) vs full budget | {seconds.value:.1f} | {seconds.baseline:.1f} | "
          f"{seconds.ratio:.3f} | {seconds.goal} |\n"
          f"| best score vs the full-budget sweep's | {same.value:.3f} | {same.baseline:.3f} | {same.ratio:.3f} | "
          f"{same.goal} |", flush=True)  # fmt: skip


def study_settings(sizes: dict, regression: bool) -> TuningSettings:
    """The tuning workflow's defaults (reduction factor 3, seed 0) at the size's trials and search space,
    ranking trials by what each table is judged by: validation accuracy for classes (the workflow's
    default, macro-F1, can prefer a trial of lower accuracy), validation RMSE for numbers (a lower test
    RMSE is a higher test R²)."""
    trials = sizes["trials"]
    metric = "" if regression else "val_accuracy"
    return TuningSettings(
        trials=trials, concurrency=min(4, trials), search_space=sizes["space"], metric=metric
    )


def tuning_table(work: Path, name: str, sizes: dict) -> list[Figure]:
    """The table's figures on each split, then the means of its scores over the splits."""
    per_split = [tuning_split(work, name, sizes, seed) for seed in sizes["split_seeds"]]
    seeds = ", ".join(str(seed) for seed in sizes["split_seeds"])
    return [figure for figures in per_split for figure in figures] + mean_figures(name, seeds, per_split)


def mean_figures(name: str, seeds: str, per_split: list[list[Figure]]) -> list[Figure]:
    """Tuned against gradient boosting and against the default: the mean scores over the splits, each
    split's ratio beside them."""
    return [
        mean_figure(f"tuning: {name}, mean over split seeds {seeds}, tuned vs {versus}",
                    [figures[index] for figures in per_split], least)
        for index, versus, least in MEANS
    ]  # fmt: skip


def mean_figure(name: str, figures: list[Figure], least: float) -> Figure:
    tuned, baseline = (
        float(np.mean(side)) for side in zip(*((f.value, f.baseline) for f in figures), strict=True)
    )
    each = ", ".join(f"{figure.ratio:.3f}" for figure in figures)
    goal = f"ratio >= {least:g}: {verdict(tuned / baseline >= least)}"
    return Figure(f"{name} (each split: {each})", tuned, baseline, "", goal)


def tuning_split(work: Path, name: str, sizes: dict, split_seed: int) -> list[Figure]:
    table = open_table(work, name, sizes["rows"], split_seed)
    base = TrainConfig(epochs=sizes["default_epochs"])
    settings = study_settings(sizes, table.regression)
    hgb, default = tables.hgb_score(table.data, table.prepared, table.label), default_score(table, base)
    study, tuned = halving(table, base, settings)
    full = full_budget(table, base, study)
    figures = table_figures(table, hgb, default, tuned, full)
    print_table(table, study, hgb, default, figures)
    return figures


def tuning(work: Path, sizes: dict, names: list[str] | None = None) -> list[Figure]:
    """Every table's figures (or those of `names`). Training runs on one thread, as the tables group's."""
    import torch
    from threadpoolctl import threadpool_limits

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with threadpool_limits(1):
            return [figure for name in names or TABLES for figure in tuning_table(work, name, sizes)]
    finally:
        torch.set_num_threads(threads)
