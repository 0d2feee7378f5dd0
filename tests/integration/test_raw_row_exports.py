"""A bundle over raw columns answers alike through its ONNX and SavedModel exports in a process where
flytekit cannot be imported (the exports themselves: tests/unit/bundle/test_raw_row_exports.py)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest

from tasks.core.bundle.loading import load_bundle
from tests.flyte_package import REPO
from tests.unit.bundle.test_raw_row_exports import assert_same_answers, scoring_rows

# Each writes or answers through a model export: seconds.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def bundles(raw_row_bundles) -> dict[str, str]:
    return raw_row_bundles  # tests/conftest.py: the unit module's tests read them too


# ---- where flytekit cannot be imported ---------------------------------------------------------------------

SCORE_WITHOUT_FLYTE = """
import json, os, sys
sys.modules["flytekit"] = None  # importing flytekit now fails
import numpy as np, onnxruntime, pyarrow.parquet as pq, tensorflow as tf
from tasks.core.bundle.loading import load_bundle
from tasks.core.bundle.raw_inputs import raw_feeds, signature_names
rows = pq.read_table(sys.argv[1])
answers = {}
for folder in sys.argv[2:]:
    bundle = load_bundle(folder)
    feeds = raw_feeds(rows, bundle.encoding)
    session = onnxruntime.InferenceSession(os.path.join(folder, "model.onnx"), providers=["CPUExecutionProvider"])
    answers[folder] = {
        "bundle": bundle.predict_proba(rows).tolist(),
        "onnx": session.run(["probabilities"], feeds)[0].tolist(),
    }
    if os.path.isdir(os.path.join(folder, "saved_model")):
        serving = tf.saved_model.load(os.path.join(folder, "saved_model")).signatures["serving_default"]
        names = signature_names(bundle.encoding)
        named = {names[column]: tf.constant(values) for column, values in feeds.items()}
        answers[folder]["saved_model"] = serving(**named)["probabilities"].numpy().tolist()
print(json.dumps(answers))
"""


@pytest.mark.slow
def test_the_same_answers_where_flytekit_cannot_be_imported(bundles, tmp_path):
    """A separate process: starting TensorFlow and torch there takes seconds."""
    rows = tmp_path / "rows.parquet"
    pq.write_table(scoring_rows(), rows)
    folders = [bundles["pytorch"], bundles["tensorflow"]]
    result = subprocess.run(
        [sys.executable, "-c", SCORE_WITHOUT_FLYTE, str(rows), *folders],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    answers = json.loads(result.stdout.strip().splitlines()[-1])
    assert sorted(answers[folders[0]]) == ["bundle", "onnx"]
    assert sorted(answers[folders[1]]) == ["bundle", "onnx", "saved_model"]
    for folder in folders:
        expected = load_bundle(folder).predict_proba(scoring_rows())
        np.testing.assert_array_equal(np.asarray(answers[folder]["bundle"], np.float32), expected)
        for probabilities in answers[folder].values():
            assert_same_answers(expected, np.asarray(probabilities, np.float32))
