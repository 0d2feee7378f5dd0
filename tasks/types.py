"""Dataclasses that cross task boundaries. Tables travel as parquet, models as files."""

from __future__ import annotations

from dataclasses import dataclass, field

from flytekit.types.directory import FlyteDirectory
from flytekit.types.file import FlyteFile
from flytekit.types.structured import StructuredDataset

from tasks.core.config import EpochMetrics, SplitPaths
from tasks.core.data import ScalerStats
from tasks.core.memory import MemoryEstimate
from tasks.core.metrics import ClassMetrics
from tasks.core.planner import OptionFit, PreprocessPlan
from tasks.storage import local_path


@dataclass
class PreparedData:
    """Standardised train/val/test splits; the label column holds class codes into `class_labels`."""

    train: StructuredDataset
    val: StructuredDataset
    test: StructuredDataset
    feature_names: list[str]
    label_column: str
    class_labels: list[str]
    class_counts: dict[str, int]
    rows: dict[str, int]
    scaler: ScalerStats
    source: str

    def local_splits(self) -> SplitPaths:
        """The train/val splits on this machine's disk, as the training loops read them."""
        return SplitPaths(
            train=local_path(self.train),
            val=local_path(self.val),
            feature_names=self.feature_names,
            label_column=self.label_column,
            n_classes=len(self.class_labels),
        )


@dataclass
class TrainedModel:
    """A model artifact plus how it was trained."""

    artifact: FlyteFile
    framework: str
    device: str
    world_size: int
    backend: str
    precision: str
    strategy: str
    accelerator: str
    accelerator_count: int
    history: list[EpochMetrics]
    samples_per_second: float
    train_seconds: float
    peak_device_memory_bytes: int = 0  # torch.cuda.max_memory_allocated; 0 on CPU
    tensorboard: FlyteDirectory | None = None  # event files: `tensorboard --logdir` on a download


@dataclass
class ResourcePlan:
    """What the planner estimated and chose; `applied` says whether the run used it."""

    applied: bool
    target: str
    framework: str
    choice: str
    device: str
    partition: str
    devices: int
    memory_gib: float
    price_per_hour: float
    estimated_peak_gib: float
    estimate: MemoryEstimate | None
    micro_batch_size: int
    grad_accum_steps: int
    effective_batch_size: int
    options: list[OptionFit]
    preprocess: PreprocessPlan
    notes: list[str] = field(default_factory=list)

    def summary(self) -> str:
        lines = [
            f"resource plan ({'applied' if self.applied else 'not applied'}) for target {self.target}: "
            f"{self.choice} ({self.device} {self.partition}".rstrip()
            + f", {self.memory_gib:g} GiB, "
            f"${self.price_per_hour:.2f}/h)",
            f"  estimated peak {self.estimated_peak_gib:.2f} GiB per device; micro-batch {self.micro_batch_size} "
            f"x {self.grad_accum_steps} accumulation x {self.devices} devices = batch {self.effective_batch_size}",
            f"  preprocess: {self.preprocess.cpu} CPU, {self.preprocess.mem} for "
            f"{self.preprocess.input_rows:,} rows x {self.preprocess.input_columns} columns",
        ]
        lines += [
            f"  {'*' if o.name == self.choice else ' '} {o.name:<18} {o.memory_gib:>6.1f} GiB "
            f"${o.price_per_hour:>5.2f}/h needs {o.required_gib:>7.2f} GiB {'fits' if o.fits else 'too small'}"
            for o in self.options
        ]
        return "\n".join(lines + [f"  note: {n}" for n in self.notes])


@dataclass
class EvaluationReport:
    accuracy: float
    macro_f1: float
    confusion_matrix: list[list[int]]
    per_class: list[ClassMetrics]
    class_labels: list[str]
    n_test: int
    framework: str
    trained_on: str
    world_size: int
    strategy: str
    accelerator: str
    accelerator_count: int
    samples_per_second: float
    train_seconds: float
    dataset: str
    resource_plan: ResourcePlan | None = None
    accelerator_partition: str = ""  # MIG partition or TPU topology of the applied plan
    planned_price_per_hour: float | None = None  # per device, from the applied plan
    peak_device_memory_bytes: int = 0
    notes: list[str] = field(default_factory=list)

    def summary(self) -> str:
        lines = [
            f"dataset: {self.dataset}",
            f"trained with {self.framework} ({self.strategy}) on {self.trained_on} x{self.world_size} "
            f"({self.samples_per_second:,.0f} samples/s, {self.train_seconds:.1f}s)",
            f"billed as: {self.accelerator} {self.accelerator_partition}".rstrip()
            + f" x{self.accelerator_count}",
            *self.notes,
            f"test rows: {self.n_test}  accuracy: {self.accuracy:.4f}  macro-F1: {self.macro_f1:.4f}",
            f"{'class':>12} {'support':>8} {'predicted':>9} {'precision':>9} {'recall':>7} {'f1':>6}",
        ]
        lines += [
            f"{c.label:>12} {c.support:>8} {c.predicted:>9} {c.precision:>9.3f} {c.recall:>7.3f} {c.f1:>6.3f}"
            for c in self.per_class
        ]
        return "\n".join(lines)
