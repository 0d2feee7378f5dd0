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


def local_path(dataset: StructuredDataset) -> str:
    """A local file or directory holding the dataset's parquet, downloading it if it is remote."""
    uri = dataset_uri(dataset)
    file_access = FlyteContextManager.current_context().file_access
    if not file_access.is_remote(uri):
        return uri
    destination = file_access.get_random_local_directory()
    file_access.get_data(uri, destination, is_multipart=True)
    return destination


def parquet_dataset(directory: str) -> StructuredDataset:
    """Wrap a local directory of parquet files; flytekit uploads it when the task returns."""
    if not os.path.isdir(directory):
        raise FileNotFoundError(directory)
    return StructuredDataset(uri=directory, file_format="parquet")
