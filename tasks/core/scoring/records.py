"""A scoring's settings and records: the job every piece shares, a piece, the plan, the measured cost of
a row, the hardware chosen, each piece's result and the report."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TypeVar

from tasks.core.bundle.loading import Bundle, load_bundle
from tasks.core.data.api import UnseenCategories
from tasks.core.evaluation.metrics import ClassificationMetrics, RegressionMetrics, RegressionSums
from tasks.core.planning.planner import CatalogEntry

T = TypeVar("T")
PREDICTION = "prediction"
PROBABILITY_PREFIX = "probability_"
# Rows a mapped piece scores at most when a large parquet file is cut by row groups.
PIECE_ROWS = 2_000_000
# Rows of the first batch timed on the planning pod (the model's measured cost per row), after a
# first call on a few rows that pays for lazy set-up.
SAMPLE_ROWS, WARM_UP_ROWS = 4096, 64
UNMATCHED_EXAMPLES = 5
NON_FINITE_EXAMPLES = 5
# Marks an output folder whose scoring has not finished; pyarrow and Spark skip names starting with '_'.
UNFINISHED = "_SCORING_UNFINISHED"
PART_NAME = re.compile(r"part-\d{5}\.parquet")
# In place of the reading's advice (VALUE_ADVICE), which speaks of preprocessing.
SCORING_ADVICE = (
    "the model reads this column as it was trained: correct the value, or leave its row out of scoring"
)
HARDWARE = ("auto", "cpu", "gpu")
# The hardware choice's assumptions: how many times faster than one CPU core a whole GPU runs the
# model's forward pass (the rest of a row's work, reading, checking and writing, stays on the host's
# core either way; docs/scoring.md says where the figure comes from), and the seconds each mapped pod
# is billed before it scores (scheduling, node scale-up, image pull, model load).
GPU_MODEL_SPEEDUP = 100.0
POD_START_SECONDS = {"cpu": 30.0, "gpu": 300.0}


@dataclass
class FanOut:
    """How a scoring spreads: pieces of at most `rows_per_piece` rows of a parquet file, at most
    `max_parallel` of them at a time, on `hardware` (auto, cpu or gpu)."""

    max_parallel: int
    hardware: str
    rows_per_piece: int


@dataclass
class ScoringPiece:
    """What one mapped task scores: a file of the input, or some row groups of a parquet file."""

    index: int
    file: str  # the file's URI
    row_groups: list[int] = field(default_factory=list)  # empty: the whole file
    rows: int = -1  # from the parquet footers; -1 for CSV, counted while scoring
    first_row: int = 0  # the piece's first row in its file, for error messages


@dataclass
class ScoringJob:
    """What every piece shares, checked once by `plan_scoring`."""

    model: str  # the bundle's URI; a publish prefix is resolved to the version its LATEST names
    dataset: str
    label_column: str  # "" when the input has no label column: no metrics
    schema: str  # the input's columns and types (Arrow IPC, base64): every part gets the same columns
    output: str  # the folder receiving one part-NNNNN.parquet per piece
    trusted_builders: list[str] = field(default_factory=list)  # a user's builders the bundle may name

    def bundle(self) -> Bundle:
        return load_bundle(self.model, trusted_builders=self.trusted_builders)


@dataclass
class RowCost:
    """Seconds one row costs on one CPU core, timed on the planning pod's first rows."""

    total: float  # reading, checking, preprocessing, the model, writing
    model: float  # of which the model's forward pass: the only part a GPU runs faster

    def on_gpu(self) -> float:
        """The row on a GPU pod: the host's work stays, the model's shrinks by GPU_MODEL_SPEEDUP."""
        return self.total - self.model + self.model / GPU_MODEL_SPEEDUP

    def gpu_speedup(self) -> float:
        return self.total / self.on_gpu()


@dataclass
class ScoringPlan:
    job: ScoringJob
    pieces: list[ScoringPiece]
    rows: int  # exact for parquet, an overestimate for CSV
    framework: str  # the bundle's: which GPU image can score it
    row_cost: RowCost  # measured on the planning machine's CPU


@dataclass
class HardwareChoice:
    """CPU or a GPU for the scoring pods, by estimated cost; decided before any accelerator is asked for."""

    device: str  # "cpu" or the chosen GPU option's name
    cpu_cost: float  # USD for all pieces on CPU pods
    gpu_cost: float  # USD for all pieces on `gpu`; 0 without one
    gpu: CatalogEntry | None  # the catalog's cheapest whole GPU, chosen or not
    reason: str


@dataclass
class PieceResult:
    index: int
    part: str
    rows: int
    confusion: list[list[int]] = field(default_factory=list)  # true x predicted class; empty without labels
    unmatched: int = 0  # labelled rows whose label is missing or not a class the model knows
    unmatched_examples: list[str] = field(default_factory=list)
    non_finite: int = 0  # rows whose model outputs are not finite: null prediction, out of the metrics
    non_finite_examples: list[str] = field(default_factory=list)  # "<file> row <n>", from 0
    regression: RegressionSums | None = None  # a regression's labelled rows, where there are labels
    unseen: UnseenCategories | None = None  # category values the model's vocabulary lacks


@dataclass(repr=False)
class ScoringReport:
    model: str
    dataset: str
    output: str
    rows: int
    pieces: int
    probability_columns: dict[str, str]  # class label -> its column
    hardware: HardwareChoice | None = None  # None: scored in this process
    metrics: ClassificationMetrics | None = None  # when the input holds the label column
    non_finite_rows: int = 0  # rows with a null prediction: the model's outputs were not finite
    notes: list[str] = field(default_factory=list)
    regression: RegressionMetrics | None = None  # a regression's, when the input holds the label column

    def summary(self) -> str:
        lines = [
            f"model: {self.model}",
            f"scored {self.rows:,} rows of {self.dataset} in {self.pieces} piece{'s' * (self.pieces != 1)} "
            f"into {self.output}",
        ]
        if self.hardware:
            lines.append(f"hardware: {self.hardware.device} ({self.hardware.reason})")
        if self.metrics:
            lines.append(
                f"labelled rows: {self.metrics.n_test:,}  accuracy: {self.metrics.accuracy:.4f}  "
                f"balanced accuracy: {self.metrics.balanced_accuracy:.4f}  macro-F1: {self.metrics.macro_f1:.4f}"
            )
        if self.regression:
            figures = self.regression
            lines.append(
                f"labelled rows: {figures.n_test:,}  RMSE: {figures.rmse:.4g}  MAE: {figures.mae:.4g}  "
                f"R²: {figures.r2:.4f} (the train mean: RMSE {figures.baseline_rmse:.4g}, R² {figures.baseline_r2:.4f})"
            )
        return "\n".join(lines + [f"note: {note}" for note in self.notes])

    def __repr__(self) -> str:
        """What `pyflyte run` prints of the workflow's outputs."""
        return f"\n{self.summary()}\n"
