"""Every task body that opens storage by URI begins with `begin_task`, so that tasks/core's fsspec reads
use flytekit's storage settings (an S3-compatible endpoint and keys), not fsspec's bare defaults."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import fsspec.config
import pytest
from flytekit.core.python_function_task import PythonFunctionTask

import tasks
from tasks.plumbing.process import begin_task

# Bodies that open no storage themselves, each with where its storage is read instead.
OPENS_NO_STORAGE = {
    "tasks.compare.check_prices": "checks a dict",
    "tasks.compare.compare": "compares two reports",
    "tasks.schedule.dataset_partition": "formats a URI template",
    "tasks.schedule.data_partition": "formats a URI template into the data input",
    "tasks.train_torch.train_torch": "the launcher: each DDP worker begins with begin_task",
    "tasks.train_torch.train_torch_multinode": "the launcher: each DDP worker begins with begin_task",
    "tasks.train_torch.train_torch_trial": "the launcher: each DDP worker begins with begin_task",
    "tasks.train_torch.train_torch_multinode_trial": "the launcher: each DDP worker begins with begin_task",
}


def project_tasks() -> dict[str, PythonFunctionTask]:
    found = {}
    for module in pkgutil.iter_modules(tasks.__path__):
        if module.ispkg:
            continue
        for value in vars(importlib.import_module(f"tasks.{module.name}")).values():
            if isinstance(value, PythonFunctionTask):
                found[value.name] = value
    return found


def test_every_task_that_opens_storage_begins_with_begin_task():
    bodies = {name: inspect.getsource(task.task_function) for name, task in project_tasks().items()}
    assert set(OPENS_NO_STORAGE) <= set(bodies), "a task named here no longer exists"
    missing = [
        name for name, body in bodies.items() if name not in OPENS_NO_STORAGE and "begin_task()" not in body
    ]
    assert not missing, f"these task bodies open storage without begin_task(): {missing}"
    workers = inspect.getsource(importlib.import_module("tasks.ddp_worker").train_with_ddp)
    assert "begin_task()" in workers


def test_begin_task_in_a_pod_makes_core_read_s3_at_flytes_endpoint(monkeypatch):
    """As in a task pod (flytekit's entrypoint sets up the execution from the pod's environment)."""
    from flytekit.bin.entrypoint import setup_execution

    from tasks.core.data.files import filesystem_for

    monkeypatch.setenv("FLYTE_AWS_ENDPOINT", "http://minio.flyte:9000")
    monkeypatch.setenv("FLYTE_AWS_ACCESS_KEY_ID", "minio")
    monkeypatch.setenv("FLYTE_AWS_SECRET_ACCESS_KEY", "miniostorage")
    dataset = "s3://my-s3-bucket/data/2026-11-25.parquet"
    assert "client_kwargs" not in filesystem_for(dataset)[0].storage_options
    with setup_execution("s3://my-s3-bucket/raw"):
        begin_task()
    options = filesystem_for(dataset)[0].storage_options
    assert options["client_kwargs"]["endpoint_url"] == "http://minio.flyte:9000"
    assert (options["key"], options["secret"]) == ("minio", "miniostorage")


@pytest.fixture(autouse=True)
def _keep_fsspec_defaults(monkeypatch):
    monkeypatch.setattr(fsspec.config, "conf", dict(fsspec.config.conf))
