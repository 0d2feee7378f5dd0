"""Getting Flyte-managed data onto the local disk of the task that reads it."""

from __future__ import annotations

import os

from flytekit import FlyteContextManager
from flytekit.types.structured import StructuredDataset


def dataset_uri(dataset: StructuredDataset) -> str:
    """Where the data lives; a decoded task input carries it on its literal, not on `.uri`."""
    uri = dataset.uri or (dataset.literal.uri if dataset.literal else None)
    if not uri:
        raise ValueError("the structured dataset has no URI: it was not written by an upstream task")
    return uri


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
