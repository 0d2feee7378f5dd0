"""column_stats.py: the train rows' per-column statistics, exact in any grouping: the exact sum, and
category counts bounded by a cap that keeps the frequent values and an exact total."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pyarrow as pa

from tasks.core.data.column_kinds import propose_kinds
from tasks.core.data.column_stats import SUM_SCALE_BITS, exact_sum
from tasks.core.data.encoding import EncodingStats, batch_stats


def test_counting_beyond_the_cap_keeps_frequent_values_and_an_exact_total():
    kinds = propose_kinds(pa.schema([("c", pa.string()), ("id", pa.string())]))
    stats = EncodingStats.empty(kinds, count_cap=3)
    for batch in range(20):
        rare = [f"rare-{batch}-{i}" for i in range(5)]
        table = pa.table({"c": ["hot"] * 3 + rare, "id": [f"id-{batch}-{i}" for i in range(8)]})
        stats = stats.merge(batch_stats(kinds, table, first_row=8 * batch, count_cap=3))
    hot = stats.columns["c"]
    assert hot.overflowed and hot.count == 160 and list(hot.counts) == ["hot"]
    fitted = stats.fit()
    assert fitted.encoded_names() == ["c=hot", "c=<other>"]
    assert "more than 3 distinct values, none frequent" in fitted.left_out["id"]


def test_exact_sum_is_the_exact_rational_sum():
    values = np.array([5e-324, -5e-324, 1e308, -1e308, 0.1, 0.2, 0.3, -2.5e-310, 3.0, 1e-300])
    assert Fraction(exact_sum(values), 2**SUM_SCALE_BITS) == sum(Fraction(v) for v in values)
