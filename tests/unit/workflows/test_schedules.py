"""The scheduled launch plans take their inputs and failure notifications from one file
(deploy/schedules.yaml, or the file SCHEDULES / MIXEDML_SCHEDULES names): a bad value is refused naming
its key, required inputs left empty are missing (the package and `make register` reading the file:
tests/integration/test_schedules.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tasks.core.data.config import DataConfig
from tasks.core.data.split_config import SplitConfig
from tasks.core.publish.promotion import PromotionPolicy
from workflows.launch_plans import SCHEDULED
from workflows.schedules import DEFAULT_PATH, ENV, PlanSpec, ScheduleError, load_schedules

# --- Bad files ------------------------------------------------------------------------------------


def specs() -> dict[str, PlanSpec]:
    return {name: plan.spec() for name, plan in SCHEDULED.items()}


def load_text(tmp_path: Path, text: str):
    path = tmp_path / "schedules.yaml"
    path.write_text(text)
    return load_schedules(specs(), path)


@pytest.mark.parametrize(
    "text, message",
    [
        ("launch_plans: {nightly_retrain: {dataset_templat: s3://b/x}}",
         "'launch_plans.nightly_retrain.dataset_templat': unknown key; did you mean 'dataset_template'?"),
        ("launch_plans: {nightly_retrian: {}}", "'launch_plans.nightly_retrian': unknown key; did you mean 'nightly_retrain'?"),
        ("launch_plans: {nightly_scoring: {max_parallel: '8'}}",
         "'launch_plans.nightly_scoring.max_parallel' = \"8\": expected a whole number"),
        ("launch_plans: {nightly_scoring: {max_parallel: 0}}",
         "'launch_plans.nightly_scoring.max_parallel' = 0: must be at least 1"),
        ("launch_plans: {nightly_retrain: {target: cuda}}", "'launch_plans.nightly_retrain.target' = 'cuda': not one of gpu"),
        ("launch_plans: {nightly_retrain: {dataset_template: 's3://b/{day}/'}}",
         "'launch_plans.nightly_retrain.dataset_template' = 's3://b/{day}/': cannot be filled: unknown fields ['day']"),
        ("launch_plans: {nightly_retrain: {hyperparameters: {epochs: 0}}}",
         "'launch_plans.nightly_retrain.hyperparameters.epochs' = 0: must be at least 1"),
        ("launch_plans: {weekly_hardware_comparison: {hyperparameters: {epoch: 3}}}",
         "'launch_plans.weekly_hardware_comparison.hyperparameters.epoch': unknown field; did you mean 'epochs'?"),
        ("launch_plans: {nightly_retrain: {promotion: {mode: strict}}}",
         "'launch_plans.nightly_retrain.promotion.mode' = 'strict': not one of gate, always"),
        ("launch_plans: {nightly_retrain: {promotion: {tolerance: 2}}}",
         "'launch_plans.nightly_retrain.promotion.tolerance' = 2.0: must be a number from 0 to 1"),
        ("launch_plans: {nightly_retrain: {promotion: {tolerence: 0.01}}}",
         "'launch_plans.nightly_retrain.promotion.tolerence': unknown field; did you mean 'tolerance'?"),
        ("launch_plans: {nightly_retrain: {promotion: gate}}",
         "'launch_plans.nightly_retrain.promotion' = 'gate': expected an object, e.g. {\"mode\": \"gate\""),
        ("launch_plans: {weekly_hardware_comparison: {prices: {cpu: -1}}}",
         "'launch_plans.weekly_hardware_comparison.prices' = {'cpu': -1.0}: every price must be a finite number >= 0"),
        ("launch_plans: {weekly_hardware_comparison: {prices: {CPU: 1}}}",
         "'launch_plans.weekly_hardware_comparison.prices' = {'CPU': 1.0}: the key 'CPU', which prices nothing: did you mean 'cpu'?"),
        ("launch_plans: {weekly_hardware_comparison: {plan_resources: 'yes'}}",
         "'launch_plans.weekly_hardware_comparison.plan_resources' = 'yes': expected true or false"),
        ("launch_plans: {nightly_retrain: {data: {column_kinds: {zip: cat}}}}",
         "'launch_plans.nightly_retrain.data.column_kinds' = {'zip': 'cat'}: 'zip': 'cat': not a kind; a column's kind is one of numeric, categorical, boolean, date"),
        ("launch_plans: {weekly_hardware_comparison: {data: {split: {problem_type: regresion}}}}",
         "'launch_plans.weekly_hardware_comparison.data.split.problem_type' = 'regresion': not one of auto, classification, regression"),
        ("launch_plans: {nightly_retrain: {data: {split: {val_fraction: 0.6}}}}",
         "'launch_plans.nightly_retrain.data.split.val_fraction' = 0.6: must be between 0 and 0.5 (exclusive)"),
        ("launch_plans: {nightly_retrain: {data: {label_column: day, split: {split_by: day}}}}",
         "'launch_plans.nightly_retrain.data.split.split_by' = 'day': is the label column"),
        ("launch_plans: {nightly_retrain: {data: {dataset: s3://b/x.parquet}}}",
         "'launch_plans.nightly_retrain.data.dataset': filled from dataset_template each time the schedule fires"),
        ("launch_plans: {nightly_retrain: {data: {label: churned}}}",
         "'launch_plans.nightly_retrain.data.label': unknown field; known fields: dataset, label_column,"),
        ("launch_plans: {nightly_retrain: {label_column: churned}}",
         "'launch_plans.nightly_retrain.label_column': unknown key; known keys: dataset_template, data,"),
        ("launch_plans: {nightly_retrain: {kickoff_time: 2026-01-01}}",
         "'launch_plans.nightly_retrain.kickoff_time': set by the schedule"),
        ("launch_plans: {nightly_scoring: [model_prefix]}", "'launch_plans.nightly_scoring' = ['model_prefix']: expected a mapping"),
        ("notifications: {email: [ml-team]}", "'notifications.email' = ['ml-team']: expected a list of email addresses"),
        ("notifications: {slack: ml@example.com}", "'notifications.slack' = 'ml@example.com': expected a list of email addresses"),
        ("notifications: {phases: [failure]}", "'notifications.phases' = ['failure']: expected a list of some of failed"),
        ("notifications: {emails: [ml@example.com]}", "'notifications.emails': unknown key; did you mean 'email'?"),
        ("launch-plans: {}", "'launch-plans': unknown key; did you mean 'launch_plans'?"),
        ("launch_plans: {nightly_retrain: {tuning: {trails: 8}}}",
         "'launch_plans.nightly_retrain.tuning.trails': unknown key; did you mean 'trials'?"),
        ("launch_plans: {nightly_retrain: {tuning: {trials: '8'}}}",
         "'launch_plans.nightly_retrain.tuning.trials' = \"8\": expected a whole number"),
        ("launch_plans: {nightly_retrain: {tuning: {trials: 2, concurrency: 3}}}",
         "'launch_plans.nightly_retrain.tuning.concurrency' = 3: more than the 2 trials"),
        ("launch_plans: {nightly_retrain: {tuning: {reduction_factor: 1}}}",
         "'launch_plans.nightly_retrain.tuning.reduction_factor' = 1: must be at least 2"),
        ("launch_plans: {nightly_retrain: {tuning: {search_space: {learning_rate: {low: 0.1, high: 0.01}, epochs: {low: 1, high: 3}}}}}",
         "'launch_plans.nightly_retrain.tuning.search_space.learning_rate' = {\"low\": 0.1, \"high\": 0.01}: inverted range"),
        ("launch_plans: {nightly_retrain: {tuning: {search_space: {batch_size: {choices: [48]}, epochs: {low: 1, high: 3}}}, hyperparameters: {grad_accum_steps: 32}}}",
         "'launch_plans.nightly_retrain.tuning.search_space.batch_size' = {\"choices\": [48]}: the value 48 gives grad_accum_steps"),
        ("launch_plans: {nightly_retrain: {tuning: {metric: val_rmse}, data: {split: {problem_type: classification}}}}",
         "'launch_plans.nightly_retrain.tuning.metric' = 'val_rmse': measures a regression, and this run is a classification"),
        ("launch_plans: {nightly_retrain: {tuning: 8}}",
         "'launch_plans.nightly_retrain.tuning' = 8: expected a mapping of study settings"),
        ("launch_plans: {nightly_retrain: {tuning: {trials: 8}, plan_resources: false}}",
         "'launch_plans.nightly_retrain.plan_resources': not an input of a study"),
        ("launch_plans: {nightly_scoring: {tuning: {trials: 8}}}",
         "'launch_plans.nightly_scoring.tuning': unknown key"),
        ("launch_plans: {nightly_retrain: {target: gpu}\n", "not valid YAML"),
        ("- nightly_retrain", "expected a mapping of 'notifications' and 'launch_plans'"),
    ],
)  # fmt: skip
def test_a_bad_file_is_refused_naming_the_key_at_fault(tmp_path, text, message):
    with pytest.raises(ScheduleError) as refused:
        load_text(tmp_path, text)
    assert message in str(refused.value)
    assert str(tmp_path / "schedules.yaml") in str(refused.value)


def test_every_key_at_fault_is_named_at_once(tmp_path):
    text = "launch_plans: {nightly_retrain: {target: cuda}, nightly_scoring: {max_parallel: 0}}"
    with pytest.raises(ScheduleError) as refused:
        load_text(tmp_path, text)
    assert "launch_plans.nightly_retrain.target" in str(refused.value)
    assert "launch_plans.nightly_scoring.max_parallel" in str(refused.value)


def test_a_file_named_by_the_environment_must_exist(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV, str(tmp_path / "absent.yaml"))
    with pytest.raises(ScheduleError, match=f"absent.yaml: no such file \\({ENV} names it\\)"):
        load_schedules(specs())


def test_required_inputs_left_empty_or_unset_are_missing_and_the_rest_are_kept(tmp_path):
    text = "launch_plans: {nightly_scoring: {model_prefix: '', label_column: churned, max_parallel: 4}}"
    schedules = load_text(tmp_path, text)
    scoring = schedules.plans["nightly_scoring"]
    assert scoring.missing == ("model_prefix", "dataset_template")
    assert scoring.inputs == {"model_prefix": "", "label_column": "churned", "max_parallel": 4}
    assert schedules.notifications == []


def test_the_shipped_file_is_valid_and_names_no_data():
    schedules = load_schedules(specs(), DEFAULT_PATH)
    assert all(plan.missing for plan in schedules.plans.values())


def test_the_nightly_retraining_gates_promotion_where_a_run_by_hand_promotes_always(tmp_path):
    """The shipped file names the gate; a file that leaves `promotion` out gets the workflow's default,
    the gate too; any policy a file gives defaults to the gate; training_pipeline alone promotes always."""
    from workflows.pipeline import training_pipeline

    shipped = load_schedules(specs(), DEFAULT_PATH).plans["nightly_retrain"].inputs["promotion"]
    assert shipped == PromotionPolicy(mode="gate", metric="macro_f1", tolerance=0.0)
    assert (
        SCHEDULED["nightly_retrain"].workflow.python_interface.default_inputs_as_kwargs["promotion"]
        == shipped
    )
    assert training_pipeline.python_interface.default_inputs_as_kwargs["promotion"].mode == "always"
    text = "launch_plans: {nightly_retrain: {promotion: {metric: accuracy, tolerance: 0.01}}}"
    given = load_text(tmp_path, text).plans["nightly_retrain"].inputs["promotion"]
    assert given == PromotionPolicy(mode="gate", metric="accuracy", tolerance=0.01)


@pytest.mark.parametrize(
    "plan, scheduled_input", [("nightly_retrain", "training_pipeline"), ("weekly_hardware_comparison", "hardware_comparison")]
)  # fmt: skip
def test_a_scheduled_workflow_takes_every_input_of_the_workflow_it_runs_and_the_template(
    plan, scheduled_input
):
    """So the file can set anything a run by hand can: the data's dataset comes from the template and the
    kickoff."""
    import workflows.comparison
    import workflows.pipeline

    runs = {"training_pipeline": workflows.pipeline.training_pipeline,
            "hardware_comparison": workflows.comparison.hardware_comparison}[scheduled_input]  # fmt: skip
    scheduled = SCHEDULED[plan].workflow.python_interface
    assert set(scheduled.inputs) - {"kickoff_time", "dataset_template"} == set(runs.python_interface.inputs)
    for name, default in runs.python_interface.default_inputs_as_kwargs.items():
        if name != "promotion":  # a schedule gates promotion: see the test above
            assert scheduled.default_inputs_as_kwargs[name] == default, name


def test_a_file_sets_the_column_kinds_the_split_and_the_problem_type_of_the_nightly_retraining(tmp_path):
    text = (
        "launch_plans: {nightly_retrain: {data: {label_column: price, column_kinds: {zip: categorical, "
        "notes: drop}, split: {split_by: day, problem_type: regression}}, int8_export: true}}"
    )
    inputs = load_text(tmp_path, text).plans["nightly_retrain"].inputs
    assert inputs["data"] == DataConfig(
        label_column="price",
        column_kinds={"zip": "categorical", "notes": "drop"},
        split=SplitConfig(split_by="day", problem_type="regression"),
    )
    assert inputs["int8_export"] is True


# --- A nightly sweep ------------------------------------------------------------------------------


def test_a_tuning_section_makes_the_nightly_retraining_a_study_of_those_settings(tmp_path):
    from flytekit import LaunchPlan

    from workflows.tuning import scheduled_tuning

    text = (
        "launch_plans: {nightly_retrain: {dataset_template: 's3://b/dt={yesterday}/', publish_to: s3://b/m, "
        "hyperparameters: {batch_size: 32}, tuning: {trials: 8, concurrency: 2, "
        "search_space: {learning_rate: {low: 0.001, high: 0.1, log: true}, epochs: {low: 1, high: 9}}}}}"
    )
    config = load_text(tmp_path, text).plans["nightly_retrain"]
    space = '{"learning_rate": {"low": 0.001, "high": 0.1, "log": true}, "epochs": {"low": 1, "high": 9}}'
    assert config.tuning == {"trials": 8, "concurrency": 2, "search_space": space} and not config.missing
    workflow, inputs = SCHEDULED["nightly_retrain"].run(config)
    assert workflow is scheduled_tuning
    assert (
        inputs["trials"] == 8
        and inputs["publish_to"] == "s3://b/m"
        and inputs["hyperparameters"].batch_size == 32
    )
    # The inputs bind to the study's launch plan as the nightly one's would.
    plan = LaunchPlan.get_or_create(workflow=workflow, name="test_nightly_study", default_inputs=inputs)
    assert plan.saved_inputs["trials"] == 8 and plan.saved_inputs["search_space"] == space


def test_without_a_tuning_section_the_nightly_retraining_trains_once(tmp_path):
    config = load_text(tmp_path, "launch_plans: {nightly_retrain: {tuning: null}}").plans["nightly_retrain"]
    assert config.tuning is None
    assert SCHEDULED["nightly_retrain"].run(config)[0] is SCHEDULED["nightly_retrain"].workflow
    assert load_schedules(specs(), DEFAULT_PATH).plans["nightly_retrain"].tuning is None  # as shipped


def test_the_scheduled_study_takes_every_input_of_the_tuning_workflow_and_the_template():
    from workflows.tuning import tuning_pipeline

    scheduled = SCHEDULED["nightly_retrain"].tuned.python_interface
    tuning = tuning_pipeline.python_interface
    assert set(scheduled.inputs) - {"kickoff_time", "dataset_template"} == set(tuning.inputs)
    for name, default in tuning.default_inputs_as_kwargs.items():
        if name != "promotion":  # a schedule gates promotion, as the nightly training does
            assert scheduled.default_inputs_as_kwargs[name] == default, name
    assert scheduled.default_inputs_as_kwargs["promotion"] == PromotionPolicy()
