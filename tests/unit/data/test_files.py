"""files.py: where an input's files are and what format they hold. A missing file or an unknown format
is named; a folder's format comes from its part files; a remote failure is one line naming the URI and
its cause."""

from __future__ import annotations

import fsspec.implementations.memory
import pytest

from tasks.core.data.assignment import SplitConfig
from tasks.core.data.files import DatasetError, detect_format
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
