"""Every target tunes: each training task resumes a trial from its checkpoint, the study's settings are
flat inputs built into one record by the check task (their defaults TuningSettings'), and a 2-rung study
trains on the TensorFlow target (the torch one end to end: tests/integration/test_tuning.py)."""

from __future__ import annotations

import dataclasses
import json
import math
import typing

import pytest
from flytekit.types.directory import FlyteDirectory

from tasks.core.data.config import DataConfig
from tasks.core.data.split_config import SplitConfig
from tasks.core.models.plugins import mlp_spec
from tasks.core.training.config import TrainConfig
from tasks.core.tuning.study import COMPLETED, DIVERGED, STOPPED, TuningSettings
from tasks.targets import TARGETS


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_every_targets_trial_task_is_its_task_cached_and_resumes_from_a_checkpoint(target):
    """A trial runs the target's task as it is, but cached (tasks/hardware.py, TRIAL_CACHE)."""
    from tasks.hardware import TRIAL_CACHE

    task, trial = TARGETS[target].task, TARGETS[target].trial_task
    hint, default = trial.python_interface.inputs_with_defaults["resume_from"]
    assert typing.get_args(hint) == (FlyteDirectory, type(None)) and default is None
    interface = (trial.python_interface.inputs, trial.python_interface.outputs)
    assert interface == (task.python_interface.inputs, task.python_interface.outputs)
    assert trial.name == f"{task.name}_trial"
    assert (trial.metadata.cache, trial.metadata.cache_version) == (True, TRIAL_CACHE.version)
    assert not task.metadata.cache
    assert trial.accelerator.to_flyte_idl() == task.accelerator.to_flyte_idl()
    same = ("container_image", "task_config", "pod_template", "resources", "environment")
    assert {name: getattr(trial, name, None) for name in same} == {
        name: getattr(task, name, None) for name in same
    }
    assert (trial.metadata.retries, trial.metadata.interruptible, trial.metadata.timeout) == (
        task.metadata.retries,
        task.metadata.interruptible,
        task.metadata.timeout,
    )


def test_a_multi_node_trial_is_priced_at_its_declared_nodes():
    from tasks.hardware import TRAIN_GPU_MULTINODE
    from tasks.tune import declared_option

    name, price = declared_option("gpu-multinode")
    gpus = TRAIN_GPU_MULTINODE.gpus_per_node * TRAIN_GPU_MULTINODE.nnodes
    assert name == f"{TRAIN_GPU_MULTINODE.device} x{gpus}" and price > 0


def test_the_check_task_builds_the_one_settings_record_and_refuses_bad_values():
    from tasks.tune import check_tuning

    flat = {"trials": 4, "concurrency": 2, "search_space": "", "metric": "val_accuracy", "seed": 3}
    settings = check_tuning(**flat, reduction_factor=2, hyperparameters=TrainConfig())
    assert settings == TuningSettings(4, 2, "", "val_accuracy", 3, 2)
    with pytest.raises(Exception, match="'concurrency' = 5"):
        check_tuning(**{**flat, "concurrency": 5}, reduction_factor=2, hyperparameters=TrainConfig())


def test_a_trial_the_target_refuses_is_named_before_it_trains():
    """A searched tf_strategy other than TPUStrategy cannot train on the tpu target: the trial is refused
    by the target's own rule, not found out in its pod."""
    from types import SimpleNamespace

    from tasks.tune import trial_problems

    table = SimpleNamespace(rows={"train": 1000}, target=SimpleNamespace(regression=False))
    prepared = SimpleNamespace(table=table)
    mirrored = TrainConfig(tf_strategy="mirrored")
    assert any(
        "'hyperparameters.tf_strategy' = 'mirrored'" in p for p in trial_problems(mirrored, prepared, "tpu")
    )
    assert trial_problems(mirrored, prepared, "gpu-tf") == []
    assert trial_problems(TrainConfig(tf_strategy="tpu"), prepared, "tpu") == []


@pytest.mark.parametrize("workflow", ["tuning_pipeline", "scheduled_tuning"])
def test_the_workflows_flat_study_inputs_default_to_the_settings_record(workflow):
    import workflows.tuning

    defaults = getattr(workflows.tuning, workflow).python_interface.default_inputs_as_kwargs
    expected = dataclasses.asdict(TuningSettings())
    assert {name: defaults[name] for name in expected} == expected


@pytest.mark.slow
def test_a_two_rung_study_trains_on_the_tensorflow_target(blobs, write_table):
    """The study's tasks in this process, without the evaluation and publishing any run has: the
    baseline and three trials of one epoch, one of which diverges (seed 3 proposes learning rate 1e9 for
    trial 1 alone); the baseline and the better of the other two resumed from their Keras checkpoints
    to three."""
    from tasks.right_sizing import prepare_data
    from tasks.tune import best_trial, check_tuning, start_study, tuning_round

    data = DataConfig(write_table(blobs), "species", split=SplitConfig(0.2, 0.2))
    base = TrainConfig(epochs=3, batch_size=32, model=mlp_spec([16]))
    space = {"learning_rate": {"choices": [3e-3, 1e-2, 1e9]}, "epochs": {"low": 1, "high": 3}}
    settings = check_tuning(trials=3, concurrency=2, search_space=json.dumps(space), metric="", seed=3,
                            reduction_factor=3, hyperparameters=base)  # fmt: skip
    prepared, preprocess_plan = prepare_data(
        data=data, target="gpu-tf", hyperparameters=base, plan_resources=True
    )
    state = start_study(settings=settings, hyperparameters=base, prepared=prepared)
    state = tuning_round(state=state, prepared=prepared, preprocess_plan=preprocess_plan, target="gpu-tf",
                         hyperparameters=base, plan_resources=True)  # fmt: skip
    trained, _, study = best_trial(state=state)
    assert study.budgets == [1, 3] and [t.state for t in study.trials if t.baseline] == [COMPLETED]
    (promoted,) = (t for t in study.proposed if t.state == COMPLETED)
    (stopped,) = (t for t in study.proposed if t.state == STOPPED)
    (diverged,) = (t for t in study.proposed if t.state == DIVERGED)
    assert diverged.number == 1 and math.isnan(diverged.rung_metrics[0]) and diverged.epochs_trained == 0
    assert promoted.epochs_trained == 3 and len(promoted.rung_metrics) == 2 and stopped.epochs_trained == 1
    assert promoted.rung_metrics[0] >= stopped.rung_metrics[0]
    best = study.trial(study.best)
    assert best.rung_metrics[-1] == max(t.rung_metrics[-1] for t in study.trials if t.state == COMPLETED)
    assert best.hardware and best.cost_usd > 0
    # The best trial's run is the resumed one: its whole history, the first rung's epoch included.
    assert trained.run.framework == "tensorflow" and [e.epoch for e in trained.run.history] == [1, 2, 3]
    assert [e.val_loss for e in trained.run.history] == best.val_losses
