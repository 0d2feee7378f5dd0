"""`PreparedTable`: what the prepared splits hold, as the preparing, training, evaluating and serving
stages pass it on. Kept apart from prepare.py so that reading a bundle does not import the preparing."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from tasks.core.data.column_kinds import NUMERIC
from tasks.core.data.encoding import ColumnEncoding, FittedEncoding, NumberEncoding
from tasks.core.data.scaling import ScalerStats
from tasks.core.data.split_config import SplitConfig
from tasks.core.data.splits import SplitPaths
from tasks.core.data.target import Target


@dataclass
class PreparedTable:
    """What the prepared splits hold. The splits prepare.py writes (`PreparedSplits`) and the task
    boundary's `PreparedData` both carry it as it is."""

    feature_names: list[str]  # in the order the model reads them
    label_column: str  # holds class codes into `class_labels`
    class_labels: list[str]
    class_counts: dict[str, int]
    rows: dict[str, int]  # by split
    scaler: ScalerStats  # fitted on the train split
    source: str = ""  # the input, as reports name it
    label_kind: str = "string"  # what the class labels were before they became text: see LABEL_KINDS
    notes: list[str] = field(default_factory=list)  # e.g. case-only class differences, columns left out
    # The input's feature columns as read (strings, dates, nulls), in the input's order, and the
    # encoding fitted on the train split that turns them into `feature_names`: the JSON text of
    # `FittedEncoding.to_dict()` (text, so that it crosses task boundaries as one plain literal).
    # A record without them is upgraded as it is built (`numbers_as_read`).
    columns: list[str] = field(default_factory=list)
    encoding: str = ""
    # What is predicted. A regression has no classes: its train and val splits hold the label
    # standardised by `target`'s train mean and deviation, float32; its test split the label as read.
    target: Target = field(default_factory=Target)
    # How the rows were split, as preprocessing was asked; None in a table prepared before it was kept.
    split: SplitConfig | None = None

    def __post_init__(self) -> None:
        if not self.columns and self.feature_names:
            self.columns = list(self.feature_names)
            self.encoding = json.dumps(numbers_as_read(self.feature_names, self.scaler.mean).to_dict())

    def split_paths(self, train: str, val: str) -> SplitPaths:
        """The train and val splits at these paths, as the training loops read them."""
        return SplitPaths(
            train, val, self.feature_names, self.label_column, len(self.class_labels), self.target.regression
        )

    def fitted_encoding(self) -> FittedEncoding:
        return FittedEncoding.from_dict(json.loads(self.encoding))

    @property
    def n_outputs(self) -> int:
        return 1 if self.target.regression else len(self.class_labels)


def numbers_as_read(feature_names: list[str], means: list[float]) -> FittedEncoding:
    """The encoding of a record written before encodings existed, whose features are the input's
    numeric columns as they are: each a number, a missing value taking its train mean (`means`), as
    a number column without missing train values is encoded now."""
    numbers = [
        ColumnEncoding(name, NUMERIC, NumberEncoding(mean, False))
        for name, mean in zip(feature_names, means, strict=False)
    ]
    return FittedEncoding(numbers, {})
