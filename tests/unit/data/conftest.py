from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

# The shared checks (assert_same_splits and the like) report their failures as a test module's do.
pytest.register_assert_rewrite("tests.unit.data.tables")


@pytest.fixture(scope="session")  # read by the target, assignment and pieces tests: written once
def diabetes(tmp_path_factory) -> str:
    from sklearn.datasets import load_diabetes

    frame = load_diabetes(as_frame=True).frame
    path = tmp_path_factory.mktemp("diabetes") / "diabetes.parquet"
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), path)
    return str(path)
