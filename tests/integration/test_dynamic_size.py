"""What propeller reads of a @dynamic: the sub-workflow its pod writes (futures.pb), through
storage.limits.maxDownloadMBs (2 MiB unless set: flytestdlib/storage/stow_store.go, tag v1.16.8). A value
the dynamic calls tasks with is copied into every node that takes it, so a tuning round echoes the
prepared data once (no pod: the echo plugin) and binds its trials, its record and the next round to that."""

from __future__ import annotations

import json
import subprocess

import pytest
from flyteidl.core import dynamic_job_pb2

from tasks.core.planning.planner import PreprocessPlan
from tasks.core.tuning.rounds import open_study
from tasks.core.tuning.study import TuningSettings
from tasks.hardware import TRIAL_CACHE
from tasks.tune import TuningState, tuning_round
from tests.conftest import POD_HYPERPARAMETERS
from tests.flyte_package import REPO, environment_of
from tests.pods import literals, merged, pod_command, pod_environment

SPACE = {"learning_rate": {"low": 1e-3, "high": 1e-2, "log": True}, "epochs": {"low": 1, "high": 3}}
TRIALS = 4


def round_futures(flyte_package, prepared, workdir) -> dynamic_job_pb2.DynamicJobSpec:
    """The first round of a 4-trial study, run as its pod runs it: the sub-workflow it hands propeller."""
    settings = TuningSettings(trials=TRIALS, concurrency=TRIALS, search_space=json.dumps(SPACE))
    state = TuningState(open_study(settings, POD_HYPERPARAMETERS, regression=False, val_rows=100))
    values = {"state": state, "preprocess_plan": PreprocessPlan(1, 1, 1, "1", "1Gi"), "target": "gpu",
              "hyperparameters": POD_HYPERPARAMETERS, "plan_resources": False}  # fmt: skip
    spec = flyte_package.tasks["tasks.tune.tuning_round"]
    command = pod_command(spec, merged(literals(tuning_round, values), prepared=prepared), workdir)
    result = subprocess.run(command, cwd=REPO, env=pod_environment() | environment_of(spec), capture_output=True,
                            text=True, timeout=600)  # fmt: skip
    futures = workdir / "outputs" / "futures.pb"
    assert result.returncode == 0 and futures.exists(), result.stdout[-3000:] + result.stderr[-3000:]
    return dynamic_job_pb2.DynamicJobSpec.FromString(futures.read_bytes())


@pytest.fixture(scope="module")
def first_round(flyte_package, prepared_by_a_pod, tmp_path_factory) -> dynamic_job_pb2.DynamicJobSpec:
    return round_futures(flyte_package, prepared_by_a_pod, tmp_path_factory.mktemp("tuning") / "round")


@pytest.mark.slow
def test_a_tuning_round_holds_the_prepared_data_once(first_round):
    futures = first_round
    bindings = {
        node.id: binding.binding
        for node in futures.nodes
        for binding in node.inputs
        if binding.var == "prepared"
    }
    copies = [node for node, binding in bindings.items() if binding.WhichOneof("value") != "promise"]
    assert len(copies) == 1, f"the prepared data is copied into {copies}"
    (echo,) = copies
    assert len(bindings) == TRIALS + 3  # the echo, the trials, the round's record and the next round
    assert all(binding.promise.node_id == echo for node, binding in bindings.items() if node != echo)
    echo_tasks = [task for task in futures.tasks if task.type == "echo"]
    assert len(echo_tasks) == 1 and not echo_tasks[0].HasField("container")  # no pod runs it


@pytest.mark.slow
def test_the_trials_run_a_cached_task_so_a_rerun_study_reuses_them(first_round):
    """Propeller caches by the task template alone (nodes/task/cache.go, IsCacheable, tag v1.16.8): a
    node's own cache override is not read, so trials run the training task's cached copy."""
    trained = {node.task_node.reference_id.name for node in first_round.nodes if node.id.startswith("trial-")}
    assert trained == {"tasks.train_torch.train_torch_trial"}
    (template,) = [task for task in first_round.tasks if task.id.name in trained]
    assert template.metadata.discoverable and template.metadata.discovery_version == TRIAL_CACHE.version


def test_the_cluster_reads_objects_and_events_of_32_mib():
    """Propeller's 2 MiB default (storage.limits.maxDownloadMBs) refuses a scoring run's list of some
    5,000 parts; flyteadmin's gRPC default (4 MiB) the event of a started @dynamic past that: the values
    raise both, alike (docs/cluster.md, What a run may hold)."""
    from tests.integration.test_deploy import flyte_config

    inline = flyte_config()
    downloads = inline["storage"]["limits"]["maxDownloadMBs"] * 2**20
    assert downloads == inline["server"]["grpc"]["maxMessageSizeBytes"] == 32 * 2**20
