"""Comparing the numbers two computations give for the same rows where they are not computed alike:
in other batch shapes, processes or runtimes."""

from __future__ import annotations

import numpy as np

# float32 rounding: oneDNN, MKL and onnxruntime pick kernels by batch shape and CPU, so the same row
# scored among other rows may differ in its last bits (6e-8 seen on an AMX CPU).
FLOAT32_TOLERANCE = {"rtol": 1e-5, "atol": 1e-6}


def assert_float32_close(actual, expected) -> None:
    np.testing.assert_allclose(actual, expected, **FLOAT32_TOLERANCE)


def assert_scored_alike(probabilities, expected) -> None:
    """Every row the same class, and its probabilities within float32 rounding (NaN where expected)."""
    probabilities, expected = np.asarray(probabilities), np.asarray(expected)
    np.testing.assert_array_equal(probabilities.argmax(axis=1), expected.argmax(axis=1))
    assert_float32_close(probabilities, expected)
