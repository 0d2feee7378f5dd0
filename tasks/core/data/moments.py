"""Per-feature moments: count, mean, sum of squared deviations (M2), minimum and maximum.

Two groups of rows merge with Chan, Golub and LeVeque's pairwise update, so the moments of many
groups equal those of one pass up to float64 rounding, whatever their order or number. The encoded
features' moments are built from the columns' statistics (scaling.py): a group of values summed up
(`one`), or a feature taking a few values, each some number of times (`of_counts`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class FeatureMoments:
    count: int
    mean: np.ndarray  # float64, one per feature
    m2: np.ndarray  # sum of squared deviations from the mean
    low: np.ndarray
    high: np.ndarray

    @classmethod
    def empty(cls, n_features: int) -> FeatureMoments:
        zeros = np.zeros(n_features)
        return cls(0, zeros, zeros.copy(), np.full(n_features, np.inf), np.full(n_features, -np.inf))

    @classmethod
    def one(cls, count: int, mean: float, m2: float, low: float, high: float) -> FeatureMoments:
        """The moments of one feature."""
        return cls(count, *(np.array([value], dtype=np.float64) for value in (mean, m2, low, high)))

    @classmethod
    def repeated(cls, count: int, value: float) -> FeatureMoments:
        """The moments of one feature that is `value` in `count` rows."""
        return cls.one(count, value, 0.0, value, value)

    @classmethod
    def of_counts(cls, values: list[float], counts: list[int]) -> FeatureMoments:
        """The moments of one feature that takes each of `values` `counts` times (some at least once)."""
        values, counts = np.asarray(values, dtype=np.float64), np.asarray(counts, dtype=np.int64)
        values, counts = values[counts > 0], counts[counts > 0]
        count = int(counts.sum())
        mean = float(values @ counts / count)
        m2 = float(counts @ np.square(values - mean))
        return cls.one(count, mean, m2, float(values.min()), float(values.max()))

    @classmethod
    def joined(cls, features: list[FeatureMoments]) -> FeatureMoments:
        """Side by side: the moments of the same rows' features, in order."""
        arrays = (
            np.concatenate([getattr(f, name) for f in features]) for name in ("mean", "m2", "low", "high")
        )
        return cls(features[0].count, *arrays)

    @classmethod
    def of(cls, rows: np.ndarray) -> FeatureMoments:
        """The moments of `rows` (rows x features, float64)."""
        if not len(rows):
            return cls.empty(rows.shape[1])
        mean = rows.mean(axis=0)
        deviations = rows - mean
        m2 = np.square(deviations, out=deviations).sum(axis=0)
        return cls(len(rows), mean, m2, rows.min(axis=0), rows.max(axis=0))

    def merge(self, other: FeatureMoments) -> FeatureMoments:
        if other.count == 0:
            return self
        if self.count == 0:
            return other
        count = self.count + other.count
        delta = other.mean - self.mean
        mean = self.mean + delta * (other.count / count)
        m2 = self.m2 + other.m2 + delta**2 * (self.count * other.count / count)
        return FeatureMoments(
            count, mean, m2, np.minimum(self.low, other.low), np.maximum(self.high, other.high)
        )

    @property
    def variance(self) -> np.ndarray:
        """The population variance, as scikit-learn's StandardScaler uses."""
        return self.m2 / max(self.count, 1)

    @property
    def constant(self) -> np.ndarray:
        return self.low == self.high
