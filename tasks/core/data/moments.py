"""Per-feature moments of the training rows, computed in pieces and merged exactly.

Each piece of the data (a batch, a part file, a pod's share) gives its count, mean, sum of squared
deviations (M2), minimum and maximum per feature; two pieces merge with Chan, Golub and LeVeque's
pairwise update, so the statistics of many pods equal those of one pass up to float64 rounding,
whatever the order or the number of pieces.
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

    def to_dict(self) -> dict:
        return {
            "count": self.count,
            **{name: getattr(self, name).tolist() for name in ("mean", "m2", "low", "high")},
        }

    @classmethod
    def from_dict(cls, saved: dict) -> FeatureMoments:
        arrays = {name: np.asarray(saved[name], dtype=np.float64) for name in ("mean", "m2", "low", "high")}
        return cls(int(saved["count"]), **arrays)


def merged(pieces: list[FeatureMoments]) -> FeatureMoments:
    total = pieces[0]
    for piece in pieces[1:]:
        total = total.merge(piece)
    return total
