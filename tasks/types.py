"""Dataclasses that cross task boundaries. Tables travel as parquet, models as files."""

from __future__ import annotations

from dataclasses import dataclass, field

from flytekit.types.directory import FlyteDirectory
from flytekit.types.file import FlyteFile
from flytekit.types.structured import StructuredDataset

from tasks.core.bundle.metric_records import ClassificationMetrics, RegressionMetrics
from tasks.core.data.pieces import PieceLayout
from tasks.core.data.prepare import PreparedTable
from tasks.core.data.splits import SplitPaths
from tasks.core.data.target import Target
from tasks.core.models.plugins import describe_spec
from tasks.core.planning.planner import OptionFit, PreprocessPlan, TrainingPlan
from tasks.core.training.records import Hardware, TrainingRun
from tasks.plumbing.storage import local_path, stored_path


@dataclass
class PreparedData:
    """Standardised train and val splits and the raw test split (scored through the model bundle, as a
    user's rows are), and what they hold."""

    train: StructuredDataset
    val: StructuredDataset
    test: StructuredDataset
    table: PreparedTable
    fingerprint: str = ""  # the input data's fingerprint, as the preprocessing cache key had it

    def splits_in_place(self) -> SplitPaths:
        """The train/val splits where they are stored (a local path or an object-store URI): each torch
        rank reads its own row groups from there instead of every rank downloading whole splits."""
        return self.table.split_paths(
            stored_path(self.train, "train split"), stored_path(self.val, "val split")
        )

    def local_splits(self) -> SplitPaths:
        """The train/val splits on this machine's disk, as the training loops read them."""
        return self.table.split_paths(
            local_path(self.train, "train split"), local_path(self.val, "val split")
        )


@dataclass
class PieceSplits:
    """What the pieces of one preprocessing share (tasks/core/data/pieces.py): where their rows lie and
    the split of every row (.npy, one byte a row)."""

    layout: PieceLayout
    assignment: FlyteFile
    fingerprint: str = ""  # the input data's fingerprint, as the preprocessing cache key had it


@dataclass
class TrainedModel:
    """A model artifact plus how it was trained and the hardware its task declares."""

    artifact: FlyteFile
    run: TrainingRun
    declared: Hardware  # the report bills the applied plan's hardware where there is one
    tensorboard: FlyteDirectory | None = None  # event files: `tensorboard --logdir` on a download
    # The training state a later run resumes from (`TrainConfig.train_until_epoch`: a tuning rung).
    checkpoint: FlyteDirectory | None = None


@dataclass
class ResourcePlan:
    """What the planner estimated and chose; `applied` says whether the run used it."""

    applied: bool
    target: str
    framework: str
    preprocess: PreprocessPlan
    training: TrainingPlan | None = None  # None: the target keeps the hardware it declares
    notes: list[str] = field(default_factory=list)

    def summary(self) -> str:
        state = "applied" if self.applied else "not applied"
        plan = self.training
        lines = [
            f"resource plan ({state}) for target {self.target}: " + (choice_line(plan) if plan else DECLARED)
        ]
        if plan:
            lines.append(
                f"  estimated peak {plan.estimated_peak_gib:.2f} GiB per device; micro-batch "
                f"{plan.micro_batch_size} x {plan.grad_accum_steps} accumulation x {plan.choice.devices} devices "
                f"= batch {plan.effective_batch_size}; training rows: {plan.data_placement}"
            )
        pre = self.preprocess
        pieces = f", then {pre.pieces} pieces of {pre.piece_mem} each" if pre.pieces > 1 else ""
        lines.append(
            f"  preprocess: {pre.cpu} CPU, {pre.mem}{pieces} for {pre.input_rows:,} rows x {pre.input_columns} columns"
        )
        if plan:
            lines += [option_line(option, option.name == plan.choice.name) for option in plan.options]
        notes = self.notes + (plan.notes if plan else [])
        return "\n".join(lines + [f"  note: {note}" for note in notes])


DECLARED = "declared in tasks/hardware.py"


def choice_line(plan: TrainingPlan) -> str:
    choice = plan.choice
    return (
        f"{choice.name} ({choice.device} {choice.partition}".rstrip()
        + f", {choice.memory_gib:g} GiB, ${choice.price_per_hour:.2f}/h)"
    )


def option_line(option: OptionFit, chosen: bool) -> str:
    return (
        f"  {'*' if chosen else ' '} {option.name:<18} {option.memory_gib:>6.1f} GiB ${option.price_per_hour:>5.2f}/h "
        f"needs {option.required_gib:>7.2f} GiB {'fits' if option.fits else 'too small'}"
    )


CLASSES_SHOWN = 20  # rows of the summary's per-class table


@dataclass(repr=False)
class EvaluationReport:
    """A run's test figures: a classification's `metrics`, or a regression's `regression`."""

    metrics: ClassificationMetrics | None
    class_labels: list[str]
    training: TrainingRun
    billed: Hardware  # the applied plan's hardware, else the task's declared hardware
    dataset: str
    resource_plan: ResourcePlan | None = None
    notes: list[str] = field(default_factory=list)
    regression: RegressionMetrics | None = None
    target: Target = field(default_factory=Target)  # what was predicted, and why

    def summary(self) -> str:
        lines = [*self.run_lines(), *self.metric_lines()]
        return "\n".join(lines)

    def run_lines(self) -> list[str]:
        run = self.training
        return [
            f"dataset: {self.dataset}",
            f"model: {describe_spec(run.config.model)}",
            f"trained with {run.framework} ({run.strategy}) on {run.device_name} x{run.world_size} "
            f"({run.samples_per_second:,.0f} samples/s, {run.train_seconds:.1f}s)",
            *([f"kept epoch {run.kept_epoch}: {run.kept_reason}"] if run.kept_epoch else []),
            *([f"class weights: {run.config.class_weight}"] if weighted(run) else []),
            f"billed as: {self.billed.describe()}",
            *([self.target.describe()] if self.target.reason else []),
            *self.notes,
        ]

    def metric_lines(self) -> list[str]:
        if self.regression is not None:
            return regression_lines(self.regression)
        metrics = self.metrics
        lines = [
            f"test rows: {metrics.n_test}  accuracy: {metrics.accuracy:.4f}  balanced accuracy: "
            f"{metrics.balanced_accuracy:.4f}  macro-F1: {metrics.macro_f1:.4f}",
            f"{'class':>12} {'support':>8} {'predicted':>9} {'precision':>9} {'recall':>7} {'f1':>6}",
        ]
        shown = metrics.per_class
        if len(shown) > CLASSES_SHOWN:  # the weakest classes, where a long table would hide the report
            shown = sorted(shown, key=lambda c: (c.f1, -c.support))[:CLASSES_SHOWN]
        lines += [
            f"{c.label:>12} {c.support:>8} {c.predicted:>9} {c.precision:>9.3f} {c.recall:>7.3f} {c.f1:>6.3f}"
            for c in shown
        ]
        if len(shown) < len(metrics.per_class):
            lines.append(
                f"(the {len(shown)} classes of lowest F1 of {len(metrics.per_class):,}; every class is in "
                "report.metrics.per_class and the evaluation Deck)"
            )
        return lines

    def __repr__(self) -> str:
        """What `pyflyte run` prints of the workflow's outputs: the summary, not every epoch and option."""
        return f"\n{self.summary()}\n"


# Registered where they are defined, so that a task module naming them has their literal types built
# once and the hyperparameters checked strictly (tasks/plumbing/literal_types.py) before it defines its tasks.
from tasks.plumbing.literal_types import register_boundary_types  # noqa: E402 - it builds on the classes above

register_boundary_types(PreparedData, PieceSplits, TrainedModel, ResourcePlan, EvaluationReport)


def regression_lines(metrics: RegressionMetrics) -> list[str]:
    return [
        f"test rows: {metrics.n_test}  RMSE: {metrics.rmse:.4g}  MAE: {metrics.mae:.4g}  R²: {metrics.r2:.4f}",
        f"baseline (the train mean): RMSE: {metrics.baseline_rmse:.4g}  MAE: {metrics.baseline_mae:.4g}  "
        f"R²: {metrics.baseline_r2:.4f}",
    ]


def weighted(run: TrainingRun) -> bool:
    """Whether the run weighed its classes' losses (`TrainConfig.class_weight`)."""
    return run.config.class_weight != "none"
