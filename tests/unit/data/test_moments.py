"""Feature moments computed in pieces merge to the moments of the whole table."""

from functools import reduce

import numpy as np
import pytest

from tasks.core.data.moments import FeatureMoments


def merged(pieces: list[FeatureMoments]) -> FeatureMoments:
    return reduce(FeatureMoments.merge, pieces)


@pytest.mark.parametrize("pieces", [1, 3, 7])
def test_merged_pieces_equal_numpy_on_the_whole_table(pieces):
    rng = np.random.default_rng(0)
    rows = rng.normal(5.0, 3.0, size=(1001, 4)) * np.array([1.0, 1e6, 1e-6, 1.0])
    cuts = np.sort(rng.choice(np.arange(1, len(rows)), size=pieces - 1, replace=False))
    parts = [FeatureMoments.of(part) for part in np.split(rows, cuts)]
    total = merged(parts)
    assert total.count == len(rows)
    np.testing.assert_allclose(total.mean, rows.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(total.variance, rows.var(axis=0), rtol=1e-10)
    np.testing.assert_array_equal(total.low, rows.min(axis=0))
    np.testing.assert_array_equal(total.high, rows.max(axis=0))


def test_empty_pieces_change_nothing_and_constant_columns_are_found():
    rows = np.array([[1.0, 2.0], [3.0, 2.0]])
    total = merged([FeatureMoments.empty(2), FeatureMoments.of(rows), FeatureMoments.of(rows[:0])])
    np.testing.assert_array_equal(total.mean, [2.0, 2.0])
    np.testing.assert_array_equal(total.constant, [False, True])
