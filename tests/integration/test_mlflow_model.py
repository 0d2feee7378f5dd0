"""A bundle's MLflow model answers as the bundle in a process where neither this project nor flytekit
can be imported (the model's files and loader: tests/unit/bundle/test_mlflow_model.py)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from tasks.core.bundle.loading import load_bundle
from tests.unit.bundle.test_mlflow_model import as_mlflow_casts
from tests.unit.bundle.test_raw_row_exports import CLASSES, scoring_rows

# The bundle's export is written in seconds, and the answer comes from a process of its own.
pytestmark = pytest.mark.slow


ANSWER_WITHOUT_THE_PROJECT = """
import json, sys
sys.modules["tasks"] = None  # importing this project's code now fails
sys.modules["flytekit"] = None
code, data, rows = sys.argv[1:4]
sys.path.insert(0, code)
import pandas as pd
from mixedml_onnx_pyfunc import _load_pyfunc
model = _load_pyfunc(data)
answers = {}
for name in ("as_read", "as_mlflow_casts"):
    frame = pd.read_pickle(f"{rows}.{name}.pkl")
    answer = model.predict(frame)
    answers[name] = {"columns": list(answer.columns), "rows": answer.values.tolist(),
                     "index": answer.index.tolist()}
print(json.dumps(answers))
"""


def test_the_loader_answers_as_the_bundle_where_the_project_cannot_be_imported(
    mlflow_model_dir, mlflow_bundle, tmp_path
):
    rows = scoring_rows()
    frames = {"as_read": rows.to_pandas(), "as_mlflow_casts": as_mlflow_casts(rows.to_pandas())}
    for name, frame in frames.items():
        frame.index = frame.index + 100  # the answer keeps the request's index
        frame.to_pickle(tmp_path / f"rows.{name}.pkl")
    result = subprocess.run(
        [sys.executable, "-I", "-c", ANSWER_WITHOUT_THE_PROJECT, str(mlflow_model_dir / "code"), str(mlflow_model_dir / "model"),
         str(tmp_path / "rows")],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    bundle = load_bundle(mlflow_bundle)
    expected = bundle.predict_proba(rows)
    assert len(set(expected.argmax(axis=1))) > 1, "an untrained model that predicts one class tests little"
    for answer in json.loads(result.stdout.strip().splitlines()[-1]).values():
        assert answer["columns"] == ["prediction"] + [f"probability_{label}" for label in CLASSES]
        assert answer["index"] == list(range(100, 100 + rows.num_rows))
        served = np.asarray([row[1:] for row in answer["rows"]], np.float32)
        assert [row[0] for row in answer["rows"]] == bundle.predict(rows).tolist()
        np.testing.assert_allclose(served, expected, atol=1e-5)
