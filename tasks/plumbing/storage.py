"""Getting Flyte-managed data onto the local disk of the task that reads it."""

from __future__ import annotations

import os

import fsspec
import fsspec.config
from flytekit import FlyteContextManager
from flytekit.core.data_persistence import get_fsspec_storage_options
from flytekit.types.structured import StructuredDataset


def dataset_uri(dataset: StructuredDataset) -> str:
    """Where the data lives; a decoded task input carries it on its literal, not on `.uri`."""
    uri = dataset.uri or (dataset.literal.uri if dataset.literal else None)
    if not uri:
        raise ValueError("the structured dataset has no URI: it was not written by an upstream task")
    return uri


def flyte_filesystem(uri: str) -> fsspec.AbstractFileSystem:
    """The filesystem for a URI in Flyte's storage, as flytekit's data persistence builds it
    (flytekit/core/data_persistence.py, `FileAccessProvider.get_filesystem_for_path`): with the
    storage settings of the task's configuration (`FLYTE_AWS_ENDPOINT` and keys for an S3-compatible
    store such as MinIO), which a bare `fsspec.core.url_to_fs` ignores."""
    return FlyteContextManager.current_context().file_access.get_filesystem_for_path(uri)


def flyte_storage_as_fsspec_defaults() -> None:
    """Makes flytekit's storage settings fsspec's defaults in this process (`fsspec.config.conf`, which
    fsspec applies to every filesystem it creates), for the code in tasks/core that opens Flyte's
    storage by URI: a DDP worker reading its rows of the splits in place, say."""
    data_config = FlyteContextManager.current_context().file_access.data_config
    options = get_fsspec_storage_options("s3", data_config)  # endpoint and keys; gs takes none
    fsspec.config.conf["s3"] = {**fsspec.config.conf.get("s3", {}), **options}


def local_path(dataset: StructuredDataset, name: str = "dataset") -> str:
    """A local file or directory holding the dataset's parquet, downloading it if it is remote."""
    uri = dataset_uri(dataset)
    file_access = FlyteContextManager.current_context().file_access
    if not file_access.is_remote(uri):
        return existing_local(uri, name)
    destination = file_access.get_random_local_directory()
    file_access.get_data(uri, destination, is_multipart=True)
    return destination


def stored_path(dataset: StructuredDataset, name: str = "dataset") -> str:
    """Where the dataset's parquet is stored, read in place: a local path (checked to exist) or a URI."""
    uri = dataset_uri(dataset)
    if FlyteContextManager.current_context().file_access.is_remote(uri):
        return uri
    return existing_local(uri, name)


def existing_local(path: str, name: str) -> str:
    """The path, if its files are still there. A local run's task outputs live in a temporary folder,
    while flytekit's local cache (in the home folder) keeps pointing at them after that folder is gone."""
    if not os.path.exists(path):
        raise FileNotFoundError(
            f"the {name} at {path} is gone: a cached task result points at files that were removed (a local "
            "run keeps them in the temporary folder, which a reboot or a cleaner empties). Run again with "
            "`pyflyte run --overwrite-cache ...` to compute them afresh."
        )
    return path


def require_local_copies(datasets: dict[str, StructuredDataset]) -> None:
    """Fail naming the first local dataset whose files are gone. Remote ones are not fetched here:
    the code that reads them downloads them."""
    file_access = FlyteContextManager.current_context().file_access
    for name, dataset in datasets.items():
        uri = dataset_uri(dataset)
        if not file_access.is_remote(uri):
            existing_local(uri, name)


def parquet_dataset(directory: str) -> StructuredDataset:
    """Wrap a local directory of parquet files; flytekit uploads it when the task returns."""
    if not os.path.isdir(directory):
        raise FileNotFoundError(directory)
    return StructuredDataset(uri=directory, file_format="parquet")
