"""The bundles real workflow runs returned, scored as a user would: the embedded digits' test rows with
their columns shuffled and id columns added, in a process where flytekit cannot be imported."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from sklearn.metrics import confusion_matrix

from tasks.core.data.assignment import SPLITS, SplitConfig, assign_splits
from tasks.core.data.prepare import EMBEDDED_DIGITS_LABEL, write_embedded_digits
from tests.flyte_package import REPO
from tests.unit.bundle.test_bundle import LOAD_WITHOUT_FLYTE


def digits_test_rows(folder: Path) -> pd.DataFrame:
    """The rows preprocessing put in the test split (seed 0, 15 % / 15 %), as the user's file holds them."""
    frame = pd.read_parquet(write_embedded_digits(str(folder)))
    codes = np.unique(frame[EMBEDDED_DIGITS_LABEL], return_inverse=True)[1]
    test = frame[assign_splits(codes, SplitConfig(seed=0)) == SPLITS.index("test")]
    shuffled = test.sample(frac=1.0, axis="columns", random_state=1)
    return shuffled.assign(image_id=[f"img-{row}" for row in test.index], batch=7)


def predicted_without_flytekit(bundle: str, rows: pd.DataFrame, folder: Path) -> list:
    path = folder / "rows.parquet"
    rows.to_parquet(path, index=False)
    result = subprocess.run(
        [sys.executable, "-c", LOAD_WITHOUT_FLYTE, str(path), bundle],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])[0]


def assert_scores_as_evaluate_did(bundle: str, accuracy: float, folder: Path) -> None:
    """The bundle's predictions on the raw test rows give exactly the confusion matrix evaluate wrote in
    its manifest, and the accuracy the run reported."""
    rows = digits_test_rows(folder)
    predicted = predicted_without_flytekit(bundle, rows, folder)
    assert all(isinstance(label, int) for label in predicted)  # integer labels come back as integers
    labels = sorted(set(rows[EMBEDDED_DIGITS_LABEL]))
    matrix = confusion_matrix(rows[EMBEDDED_DIGITS_LABEL], predicted, labels=labels)
    written = json.loads(Path(bundle, "bundle.json").read_text())["metrics"]
    assert matrix.tolist() == written["confusion_matrix"]
    assert np.trace(matrix) / len(rows) == written["accuracy"] == accuracy
