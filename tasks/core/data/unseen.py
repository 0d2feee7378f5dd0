"""Category values that rows to score hold but the model's vocabulary lacks, counted by column: a
scoring report warns where most of a column's values fall to `<other>`, as codes written another way
than in training do ('123' for '00123', a number for a code)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc

from tasks.core.data.column_kinds import CATEGORICAL, Place, canonical
from tasks.core.data.encoding import FittedEncoding
from tasks.core.messages import preview

EXAMPLES = 3


@dataclass
class UnseenCategories:
    counts: dict[str, list[int]] = field(default_factory=dict)  # column -> [values present, unknown]
    examples: dict[str, list[str]] = field(default_factory=dict)  # column -> a few unknown values

    @classmethod
    def of(cls, encoding: FittedEncoding | None, batch: pa.RecordBatch) -> UnseenCategories:
        """The batch's category values outside each column's vocabulary; it holds the encoded columns."""
        unseen = cls()
        for column in encoding.columns if encoding else []:
            if column.kind != CATEGORICAL:
                continue
            text = pc.cast(canonical(CATEGORICAL, batch.column(column.name), Place(column.name)), pa.string())
            present = text.drop_null()
            unknown = present.filter(
                pc.invert(pc.is_in(present, pa.array(column.encoder.vocabulary, pa.string())))
            )
            unseen.counts[column.name] = [len(present), len(unknown)]
            unseen.examples[column.name] = pc.unique(unknown)[:EXAMPLES].to_pylist()
        return unseen

    def merge(self, other: UnseenCategories) -> UnseenCategories:
        merged = UnseenCategories(
            {name: list(counts) for name, counts in self.counts.items()}, dict(self.examples)
        )
        for name, (present, unknown) in other.counts.items():
            total = merged.counts.setdefault(name, [0, 0])
            total[0], total[1] = total[0] + present, total[1] + unknown
            seen = merged.examples.get(name, [])
            merged.examples[name] = list(dict.fromkeys(seen + other.examples.get(name, [])))[:EXAMPLES]
        return merged

    def notes(self) -> list[str]:
        """A note for each column whose values are mostly unknown to the model."""
        return [
            f"column {name!r}: {unknown:,} of its {present:,} values ({unknown / present:.0%}) are none the "
            f"model was trained on (e.g. {preview([repr(v) for v in self.examples.get(name, [])])}), so they "
            f"are all read as '{name}=<other>'; check that the column holds the values training saw, written "
            "alike (a code keeps its leading zeros: '00123' is not '123')"
            for name, (present, unknown) in self.counts.items()
            if present and unknown > present / 2
        ]


def merged_unseen(parts: Iterable[UnseenCategories | None]) -> UnseenCategories:
    """The counts of the pieces of the rows, added up."""
    total = UnseenCategories()
    for part in parts:
        total = total.merge(part or UnseenCategories())
    return total
