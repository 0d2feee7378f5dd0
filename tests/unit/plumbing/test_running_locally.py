"""Where pyflyte prints a workflow's outputs itself (a local run), a task does not print its summary too."""

from __future__ import annotations

from flytekit import task, workflow

from tasks.plumbing.process import running_locally


@task
def where() -> bool:
    return running_locally()


@workflow
def where_in_a_workflow() -> bool:
    return where()


def test_a_local_run_knows_it_is_local_and_a_plain_call_does_not_claim_it():
    assert where() is True and where_in_a_workflow() is True
    assert running_locally() is False  # outside any run: as a pod's entrypoint would not be local either
