"""`pyflyte` against a stand-in for flyteadmin that records what registration asks of it.

A test points the Makefile's BIN at a folder whose `pyflyte` runs this, so `make register` runs as
written and the test reads, from the file ADMIN_CALLS names, which launch plans were created (with or
without a schedule) and which were activated. Fast registration's code upload is skipped: nothing
would receive it.
"""

from __future__ import annotations

import json
import os

from flytekit.clis.sdk_in_container.pyflyte import main
from flytekit.models.launch_plan import LaunchPlanState
from flytekit.remote.remote import FlyteRemote


def record(call: str, name: str, **details) -> None:
    with open(os.environ["ADMIN_CALLS"], "a") as calls:
        calls.write(json.dumps({"call": call, "name": name, **details}) + "\n")


class RecordingAdmin:
    def create_task(self, task_identifer, task_spec) -> None:
        pass

    def create_workflow(self, workflow_identifier, workflow_spec) -> None:
        pass

    def create_launch_plan(self, launch_plan_identifer, launch_plan_spec) -> None:
        scheduled = launch_plan_spec.entity_metadata.schedule is not None
        record("create_launch_plan", launch_plan_identifer.name, scheduled=scheduled)

    def update_launch_plan(self, id, state) -> None:
        record("update_launch_plan", id.name, active=state == LaunchPlanState.ACTIVE)


ADMIN = RecordingAdmin()
FlyteRemote.client = property(lambda remote: ADMIN)
FlyteRemote.fast_package = lambda remote, *args, **kwargs: (b"\0" * 16, "s3://nowhere/code.tar.gz")

if __name__ == "__main__":
    main()
