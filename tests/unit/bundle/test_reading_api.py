"""Serving reads rows and the fitted preprocessing through tasks.core.data.api alone (that the module
stays light: tests/integration/test_imports.py); input the model cannot read is refused with the one
error for it, DatasetError."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from tasks.core.bundle.table_input import BundleError, arrow_features
from tasks.core.data import api
from tasks.core.data.prepare import PreparedTable
from tasks.plumbing.code_version import project_imports

REPO = Path(__file__).resolve().parents[3]
SERVING = sorted(
    ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
    for package in ("bundle", "evaluation", "publish", "scoring")
    for path in (REPO / "tasks" / "core" / package).glob("*.py")
)
API = "tasks.core.data.api"


def test_serving_modules_are_found():
    assert {"tasks.core.bundle.loading", "tasks.core.scoring.plan"} <= set(SERVING)


@pytest.mark.parametrize("module", SERVING)
def test_serving_imports_the_data_package_only_through_its_api(module):
    """Function-level imports count as much as the module's own."""
    inside = {name for name in project_imports(module) if name.split(".")[:3] == ["tasks", "core", "data"]}
    assert inside <= {API}, f"{module} imports {sorted(inside - {API})}; import them from {API}"


def test_every_exported_name_is_there():
    assert sorted(name for name in api.__all__ if not hasattr(api, name)) == []


def test_prepared_table_is_one_class_wherever_it_is_imported_from():
    assert api.PreparedTable is PreparedTable


@pytest.mark.parametrize(
    "table",
    [pa.table({"f0": [1.0, 2.0]}), pa.table({"f0": [1.0, 2.0]}).to_pandas()],
    ids=["arrow", "pandas"],
)
def test_a_missing_column_is_the_one_error_for_unreadable_input(table):
    """Callers catch DatasetError for any input the model cannot read; those that catch the bundle's
    BundleError catch it too."""
    with pytest.raises(api.DatasetError) as refused:
        arrow_features(table, ["f0", "f1"], "rows.parquet")
    assert isinstance(refused.value, BundleError)
    assert str(refused.value).startswith("rows.parquet: missing feature column 'f1'")
