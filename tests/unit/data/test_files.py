"""files.py: where an input's files are and what format they hold. A missing file or an unknown format
is named; a folder's format comes from its part files; a remote failure is one line naming the URI and
its cause."""

from __future__ import annotations

import ast
from pathlib import Path

import fsspec
import fsspec.implementations.memory
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from tasks.core.data.assignment import SplitConfig
from tasks.core.data.files import DatasetError, detect_format, parquet_split
from tasks.core.data.fingerprint import dataset_fingerprint, describe_input
from tasks.core.data.prepare import prepare_dataset
from tasks.core.data.reading import open_dataset
from tests.conftest import blobs_frame
from tests.unit.data.tables import PART_ROWS, prepare, uneven_parts

# --- local files and folders ----------------------------------------------------------------------


def test_missing_file_and_unknown_format(tmp_path):
    with pytest.raises(DatasetError, match="no such file"):
        prepare(str(tmp_path / "nope.parquet"), tmp_path)
    with pytest.raises(DatasetError, match="file format"):
        prepare(str(tmp_path / "data.xlsx"), tmp_path)


def test_compressed_csv_and_parquet_directory(blobs, tmp_path):
    compressed = tmp_path / "data.csv.gz"
    blobs.to_csv(compressed, index=False)
    directory = tmp_path / "parts.parquet"
    directory.mkdir()
    blobs.iloc[:150].to_parquet(directory / "a.parquet", index=False)
    blobs.iloc[150:].to_parquet(directory / "b.parquet", index=False)
    for path in (compressed, directory):
        prepared = prepare(str(path), tmp_path / "out" / path.name)
        assert sum(prepared.table.rows.values()) == len(blobs)


def test_a_folder_of_parts_is_read_whatever_its_name(tmp_path):
    for suffix in (".parquet", ".csv.gz"):
        folder = tmp_path / f"exported{suffix.replace('.', '-')}"
        uneven_parts(folder, suffix)
        (folder / "_SUCCESS").write_bytes(b"")
        (folder / ".part-00000.crc").write_bytes(b"checksum")
        prepared = prepare_dataset(str(folder), "species", str(tmp_path / folder.name / "out"), SplitConfig())
        assert sum(prepared.table.rows.values()) == sum(PART_ROWS)


def test_a_folder_mixing_formats_is_refused_naming_a_file_of_each(tmp_path):
    folder = tmp_path / "parts.parquet"
    uneven_parts(folder, ".parquet")
    blobs_frame(n_rows=20).to_csv(folder / "extra.csv", index=False)
    with pytest.raises(DatasetError) as error:
        prepare_dataset(str(folder), "species", str(tmp_path / "out"), SplitConfig())
    message = str(error.value)
    assert "mixes file formats" in message and "csv (" in message and "parquet (" in message
    assert "extra.csv" in message and "part-00004.parquet" in message


def test_a_folder_of_unnamed_parts_takes_the_folder_name_or_is_refused(tmp_path):
    for name, refused in (("parts.parquet", False), ("parts", True)):
        folder = tmp_path / name
        folder.mkdir()
        blobs_frame().to_parquet(folder / "part-00000", index=False)
        if refused:
            with pytest.raises(DatasetError, match="cannot tell the format of its part files"):
                detect_format(str(folder))
        else:
            assert detect_format(str(folder)) == "parquet"


# --- remote inputs --------------------------------------------------------------------------------


class NoCredentialsError(Exception):
    """Stands in for botocore's: no network is touched."""


def fail_with(error: Exception):
    def fail(*args, **kwargs):
        raise error

    return fail


def remote_refusals(uri: str) -> list[str]:
    messages = []
    for read in (open_dataset, describe_input, dataset_fingerprint):
        with pytest.raises(DatasetError) as error:
            read(uri)
        messages.append(str(error.value))
    return messages


def test_remote_failure_is_one_line_naming_the_uri_and_cause(monkeypatch):
    uri = "memory://bucket/data.parquet"
    error = NoCredentialsError("Unable to locate credentials")
    monkeypatch.setattr(fsspec.implementations.memory.MemoryFileSystem, "info", fail_with(error))
    for message in remote_refusals(uri):
        assert message == f"cannot read {uri}: NoCredentialsError: Unable to locate credentials"


def test_unreachable_host_reported_as_missing_file_names_the_cause(monkeypatch):
    uri = "memory://bucket/data.csv"
    unreachable = FileNotFoundError(uri)
    unreachable.__cause__ = ConnectionError("Cannot connect to host\nstorage.example:443 [DNS failure]")
    monkeypatch.setattr(fsspec.implementations.memory.MemoryFileSystem, "info", fail_with(unreachable))
    for message in remote_refusals(uri):
        assert (
            message
            == f"cannot read {uri}: ConnectionError: Cannot connect to host storage.example:443 [DNS failure]"
        )


def refusal_of(uri: str) -> str:
    with pytest.raises(DatasetError) as error:
        open_dataset(uri)
    return str(error.value)


def test_refused_connection_names_the_uri():
    uri = "http://127.0.0.1:9/data.parquet"  # the local discard port: refused at once, no DNS
    message = refusal_of(uri)
    assert message.startswith(f"cannot read {uri}: ") and "\n" not in message


def test_missing_remote_file_is_still_no_such_file():
    assert (
        refusal_of("memory://bucket/absent.parquet")
        == "memory://bucket/absent.parquet: no such file or directory"
    )


# --- run storage: one way in ------------------------------------------------------------------------

# pyarrow's readers and writers that open a path themselves when given no filesystem.
PATH_OPENERS = {
    "dataset",
    "read_table",
    "read_metadata",
    "read_schema",
    "ParquetFile",
    "ParquetDataset",
    "ParquetWriter",
    "write_table",
    "write_dataset",
}
# Where a path is opened without a filesystem on purpose: parquet_split's local branch, and the
# embedded digits written to a local temporary folder.
LOCAL_ONLY = {
    ("tasks/core/data/files.py", "parquet_split"),
    ("tasks/core/data/prepare.py", "write_embedded_digits"),
}


def opened_files(function: ast.FunctionDef) -> set[str]:
    """Names `function` binds to a file some filesystem opened (`with fs.open(...) as stream`)."""
    names = set()
    for node in ast.walk(function):
        if isinstance(node, ast.withitem) and isinstance(node.optional_vars, ast.Name):
            value, name = node.context_expr, node.optional_vars.id
        elif (
            isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
        ):
            value, name = node.value, node.targets[0].id
        else:
            continue
        if (
            isinstance(value, ast.Call)
            and isinstance(value.func, ast.Attribute)
            and "open" in value.func.attr
        ):
            names.add(name)
    return names


def opens_a_path(call: ast.AST, opened: set[str]) -> bool:
    """A pyarrow call that opens a path itself: no `filesystem=`, and its first argument is not an opened
    file (a call such as `filesystem.open_input_file(...)`, or a name bound to one)."""
    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)):
        return False
    func = call.func
    if func.attr not in PATH_OPENERS or not (
        isinstance(func.value, ast.Name) and func.value.id in {"ds", "pq"}
    ):
        return False
    if any(keyword.arg == "filesystem" for keyword in call.keywords):
        return False
    first = call.args[0] if call.args else None
    return not (isinstance(first, ast.Call) or (isinstance(first, ast.Name) and first.id in opened))


def path_openings(path: Path) -> list[tuple[str, int]]:
    """(enclosing function, line) of each pyarrow call in `path` that opens a path itself."""
    functions = [node for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.FunctionDef)]
    openings = []
    for function in functions:
        opened = opened_files(function)  # once per function, not per call in it
        openings += [
            (function.name, call.lineno) for call in ast.walk(function) if opens_a_path(call, opened)
        ]
    return openings


def test_every_read_of_run_storage_goes_through_the_filesystem_helper():
    """pyarrow given a URI and no filesystem opens it with its own S3 filesystem, which knows none of the
    run's storage settings (an S3-compatible endpoint such as MinIO): every split is opened by
    `parquet_split`, every other input through `filesystem_for`."""
    root = Path(__file__).resolve().parents[3]
    modules = sorted([*(root / "tasks").rglob("*.py"), *(root / "workflows").rglob("*.py")])
    bypasses = [
        f"{module.relative_to(root)}:{line} in {function}"
        for module in modules
        for function, line in path_openings(module)
        if (str(module.relative_to(root)), function) not in LOCAL_ONLY
    ]
    assert bypasses == []


def test_a_split_in_object_storage_is_read_through_fsspec(tmp_path):
    """memory:// exists for fsspec only, so reading it proves the split was not opened by pyarrow's own
    filesystem."""
    table = pa.table({"x": [1.0, 2.0, 3.0], "label": [0, 1, 1]})
    memory = fsspec.filesystem("memory")
    with memory.open("memory://run/train/part-0.parquet", "wb") as out:
        pq.write_table(table, out)
    assert parquet_split("memory://run/train").to_table().equals(table)
    with pytest.raises(pa.ArrowInvalid):
        ds.dataset("memory://run/train")
