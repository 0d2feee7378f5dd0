"""Rules on the workflows' inputs, each checked where it lives: the hyperparameters' values and ranges,
their JSON as the command line and a remote launch deliver it, the comparison's prices, the column
kinds and the time column to split by. A refused input is named in the message with its fix."""

from __future__ import annotations

import json

import msgpack
import pytest
from flytekit.core.context_manager import FlyteContextManager
from flytekit.core.type_engine import MESSAGEPACK, TypeEngine
from flytekit.interaction.click_types import JsonParamType
from flytekit.models.literals import Binary, Literal, Scalar
from google.protobuf import json_format, struct_pb2

import tasks.types  # noqa: F401 - registers the transformer that decodes TrainConfig strictly
from tasks.core.data.config import DataConfig
from tasks.core.data.split_config import SplitConfig
from tasks.core.evaluation.compare import RunSummary, compare_runs
from tasks.core.messages import InputError
from tasks.core.models.plugins import ModelSpec, mlp_options
from tasks.core.training.config import INT_RANGES, TrainConfig, hyperparameter_problems, parse_hyperparameters
from tasks.core.training.records import Hardware, TrainingRun
from tasks.core.validation import data_problems

INF, NAN = float("inf"), float("nan")

# field -> (bad value, fragments the message must contain)
VALUE_CASES = {
    "learning_rate inf": ("learning_rate", INF, ["'hyperparameters.learning_rate' = inf", "finite"]),
    "learning_rate nan": ("learning_rate", NAN, ["'hyperparameters.learning_rate' = nan", "finite"]),
    "weight_decay -inf": ("weight_decay", -INF, ["'hyperparameters.weight_decay' = -inf", "finite"]),
    "negative seed": ("seed", -1, ["'hyperparameters.seed' = -1", "at least 0", '{"seed": 0}']),
    "seed past numpy": ("seed", 2**32, ["'hyperparameters.seed' = 4294967296", "at most 4,294,967,295"]),
    "epochs past int64": ("epochs", 10**20, ["'hyperparameters.epochs' = 10", "at most 1,000,000"]),
    "timeout past timedelta": ("collective_timeout_s", 10**18, ["collective_timeout_s", "at most 604,800"]),
    "zero accumulation": ("grad_accum_steps", 0, ["'hyperparameters.grad_accum_steps' = 0", "at least 1"]),
    "model option nan": ("model", ModelSpec(options={"dropout": NAN}), ["'hyperparameters.model'", "dropout must be finite"]),
    "checkpoint steps": ("checkpoint_every_steps", -5, ["checkpoint_every_steps' = -5", "at least 0"]),
}  # fmt: skip


@pytest.mark.parametrize("case", list(VALUE_CASES))
def test_a_value_out_of_range_or_not_finite_is_refused_naming_the_field(case):
    name, value, fragments = VALUE_CASES[case]
    (message,) = hyperparameter_problems(TrainConfig(**{name: value}))
    for fragment in fragments:
        assert fragment in message, message


@pytest.mark.parametrize("name", list(INT_RANGES))
def test_each_integer_field_accepts_the_ends_of_its_range(name):
    low, high = INT_RANGES[name]
    for value in (low, high):
        divides = {"batch_size": value} if name == "grad_accum_steps" else {}  # the batch it splits
        within = {"epochs": max(value, 1)} if name == "train_until_epoch" else {}  # at most the epochs
        config = TrainConfig(**{name: value, **divides, **within})
        assert name not in config.problems(), (name, value)


# raw JSON -> fragments the message must contain
JSON_CASES = {
    "unknown top-level field": ({"epocs": 1}, ["'hyperparameters.epocs': unknown field", "'epochs'",
                                               "known fields: epochs, batch_size"]),
    "unknown model field": ({"model": {"builder": "cnn", "option": {}}},
                            ["'hyperparameters.model.option': unknown field", "known fields: builder, input_shape, options"]),
    "float for an int": ({"epochs": 2.7}, ["'hyperparameters.epochs' = 2.7: expected a whole number"]),
    "true for an int": ({"batch_size": True}, ["'hyperparameters.batch_size' = true: expected a whole number"]),
    "string for a number": ({"learning_rate": "fast"}, ["'hyperparameters.learning_rate' = \"fast\": expected a number"]),
    "number for a string": ({"precision": 16}, ["'hyperparameters.precision' = 16: expected a string"]),
    "string for the model": ({"model": "cnn"}, ["'hyperparameters.model' = 'cnn': expected an object",
                                               '{"builder": "cnn"']),
    "list of strings as an option": ({"model": {"options": {"hidden_sizes": ["a"]}}},
                                     ["'hyperparameters.model.options.hidden_sizes'", "list of numbers"]),
    "not an object": ([5], ["'hyperparameters' = [5]: expected an object"]),
}  # fmt: skip


@pytest.mark.parametrize("case", list(JSON_CASES))
def test_a_typo_or_wrong_type_in_the_json_is_refused_naming_the_field(case):
    raw, fragments = JSON_CASES[case]
    with pytest.raises(InputError) as error:
        parse_hyperparameters(raw)
    for fragment in fragments:
        assert fragment in str(error.value), str(error.value)


def test_numbers_decode_to_their_fields_types_and_an_option_list_to_its_comma_form():
    raw = {"epochs": 3.0, "learning_rate": 1, "model": {"options": {"hidden_sizes": [64, 32], "dropout": 0}}}
    config = parse_hyperparameters(raw)
    assert config == TrainConfig(
        epochs=3, learning_rate=1.0, model=ModelSpec(options={"hidden_sizes": "64,32", "dropout": 0.0})
    )
    assert type(config.epochs) is int and type(config.learning_rate) is float
    assert mlp_options(config.model.options) == ([64, 32], 0.0)
    assert raw["model"]["options"]["hidden_sizes"] == [64, 32]  # the caller's value is not changed


def test_the_command_line_parser_refuses_an_unknown_field():
    parser = JsonParamType(TrainConfig)
    with pytest.raises(InputError, match="'hyperparameters.epocs': unknown field"):
        parser.convert('{"epocs": 1}', None, None)
    assert parser.convert('{"epochs": 1}', None, None) == TrainConfig(epochs=1)


def convert(literal: Literal) -> TrainConfig:
    return TypeEngine.to_python_value(FlyteContextManager.current_context(), literal, TrainConfig)


def msgpack_literal(raw: dict) -> Literal:
    return Literal(scalar=Scalar(binary=Binary(value=msgpack.dumps(raw), tag=MESSAGEPACK)))


def test_a_launched_literal_with_an_unknown_field_is_refused_where_the_task_decodes_it():
    with pytest.raises(InputError) as error:
        convert(msgpack_literal({"epochs": 2, "model": {"builder": "cnn", "option": {"channels": "8"}}}))
    assert "'hyperparameters.model.option': unknown field" in str(error.value)
    with pytest.raises(InputError, match="'hyperparameters.seed' = 1.5: expected a whole number"):
        convert(msgpack_literal({"seed": 1.5}))


def test_a_config_out_of_range_is_refused_naming_the_field_before_it_is_encoded():
    context = FlyteContextManager.current_context()
    with pytest.raises(InputError, match="'hyperparameters.epochs' = 100000000000000000000: must be at most"):
        TypeEngine.to_literal(
            context, TrainConfig(epochs=10**20), TrainConfig, TypeEngine.to_literal_type(TrainConfig)
        )


def test_literals_decode_as_before_from_msgpack_and_from_a_json_struct():
    config = TrainConfig(epochs=3, model=ModelSpec("cnn", "1x8x8", {"channels": "8,16"}))
    context = FlyteContextManager.current_context()
    literal = TypeEngine.to_literal(context, config, TrainConfig, TypeEngine.to_literal_type(TrainConfig))
    assert convert(literal) == config
    # An older literal: a JSON struct, which carries every number as a float.
    struct = json_format.Parse(json.dumps({"epochs": 3, "model": {"builder": "cnn"}}), struct_pb2.Struct())
    assert convert(Literal(scalar=Scalar(generic=struct))) == TrainConfig(epochs=3, model=ModelSpec("cnn"))


def summary(name: str, device: str, billed: Hardware) -> RunSummary:
    training = TrainingRun(
        "pytorch", device, device, billed.count, "gloo", "fp32", "DDP", [], 100.0, 3600.0, TrainConfig()
    )
    return RunSummary(name, training, billed, accuracy=0.9, macro_f1=0.9)


LOCAL_RUN = summary("gpu", "cpu", Hardware("cpu", 2))

# prices -> fragments the message must contain
PRICE_CASES = {
    "negative": ({"cpu": -0.5}, ["input 'prices['cpu']' = -0.5", "finite number >= 0", "--prices"]),
    "NaN": ({"cpu": NAN}, ["input 'prices['cpu']' = nan"]),
    "infinite": ({"cpu": INF}, ["input 'prices['cpu']' = inf"]),
    "another accelerator's": ({"cpu": 0.5, "nvidia-l4": -1.0}, ["input 'prices['nvidia-l4']' = -1.0"]),
}  # fmt: skip


@pytest.mark.parametrize("case", list(PRICE_CASES))
def test_a_price_that_is_not_finite_and_at_least_0_is_refused_naming_it(case):
    prices, fragments = PRICE_CASES[case]
    with pytest.raises(InputError) as error:
        compare_runs([LOCAL_RUN], prices)
    for fragment in fragments:
        assert fragment in str(error.value), str(error.value)


@pytest.mark.parametrize(
    "key, guess", [("CPU", "did you mean 'cpu'?"), ("nvidia-l4 ", "did you mean 'nvidia-l4'?"), ("gpu", "")]
)
def test_a_price_under_a_name_that_prices_nothing_is_refused_naming_the_known_ones(key, guess):
    from tasks.catalog import DEFAULT_PRICES_PER_HOUR

    with pytest.raises(InputError) as error:
        compare_runs([LOCAL_RUN], {key: 1.0}, DEFAULT_PRICES_PER_HOUR)
    message = str(error.value)
    assert f"input 'prices' has the key {key!r}, which prices nothing: {guess}" in message
    assert "known: cpu, nvidia-l4, " in message
    assert compare_runs([LOCAL_RUN], {"cpu": 1.0}, DEFAULT_PRICES_PER_HOUR).rows[0].cost_usd is not None


def test_a_whole_number_is_a_price_from_the_command_line_to_the_cost():
    context = FlyteContextManager.current_context()
    literal = TypeEngine.to_literal(
        context, {"cpu": 1}, dict[str, float], TypeEngine.to_literal_type(dict[str, float])
    )
    prices = TypeEngine.to_python_value(context, literal, dict[str, float])
    assert prices == {"cpu": 1.0}
    (row,) = compare_runs([LOCAL_RUN], prices).rows
    assert row.cost_usd == pytest.approx(2.0)  # 2 workers for an hour at 1 per worker-hour
    assert compare_runs([LOCAL_RUN], {"cpu": 0}).rows[0].cost_usd == 0


# run -> what the note on its price must say, and must not
NOTE_CASES = {
    "local run, whatever the plan": (LOCAL_RUN, "gpu: ran on CPU worker processes here, not on the planned hardware",
                                     "no resource plan was applied"),
    "declared hardware on a cluster": (summary("tpu", "tpu", Hardware("tpu-v5-lite-podslice", 4, "2x2")),
                                       "tpu: no resource plan was applied", "ran on CPU"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(NOTE_CASES))
def test_the_comparison_note_says_where_a_price_came_from_and_nothing_else(case):
    run, says, not_said = NOTE_CASES[case]
    (note,) = compare_runs([run], {"cpu": 0.04, "tpu-v5-lite-podslice": 1.2}).notes
    assert says in note and not_said not in note, note
    assert f"priced at prices['{run.billed.accelerator}']" in note


def test_a_run_billed_by_an_applied_plan_has_no_note():
    planned = summary("gpu", "cuda", Hardware("nvidia-l4", 1, price_per_hour=0.71))
    assert compare_runs([planned], {}).notes == []


def test_on_a_cluster_every_step_of_the_comparison_waits_for_its_prices_check():
    """A local run checks the prices first because it runs the nodes in order
    (tests/integration/test_comparison.py); a cluster runs what the graph allows, so there every other
    node must follow the check."""
    from workflows.comparison import hardware_comparison

    upstream = {node.id: {up.id for up in node.upstream_nodes} for node in hardware_comparison.nodes}
    names = {node.id: node.flyte_entity.name for node in hardware_comparison.nodes}
    (check,) = [node for node, name in names.items() if name == "tasks.compare.check_prices"]

    def before(node: str) -> set[str]:
        return set().union(*({up} | before(up) for up in upstream[node]))

    assert upstream[check] == set()
    for node in upstream.keys() - {check}:
        assert check in before(node), f"{names[node]} does not wait for the prices check"


@pytest.mark.parametrize(
    ("column_kinds", "refused"),
    [
        ({}, []),
        ({"zip": "categorical", "notes": "drop", "age": "numeric", "ok": "boolean", "d": "date"}, []),
        ({"name": "text", "notes": "drop"}, []),
        ({"zip": "words", "notes": "drop"}, ["zip"]),
        ({"a": "Categorical", "b": ""}, ["a", "b"]),
    ],
)
def test_column_kinds_are_checked_before_the_data_is_read(column_kinds, refused):
    found = data_problems(DataConfig("d.csv", column_kinds=column_kinds))
    assert len(found) == (1 if refused else 0)
    for problem in found:  # one message, naming every column at fault
        assert problem.startswith(f"input 'data.column_kinds' = {column_kinds!r}: ")
        assert all(f"{name!r}: {column_kinds[name]!r}" in problem for name in refused)
        assert (
            "not a kind; a column's kind is one of numeric, categorical, boolean, date, text, drop" in problem
        )
        assert json.dumps({"column_kinds": dict.fromkeys(refused, "categorical")}) in problem


def test_the_label_column_is_refused_before_the_data_is_read():
    assert data_problems(DataConfig("d.csv", split=SplitConfig(split_by="day"))) == []
    assert data_problems(DataConfig("d.csv", split=SplitConfig(split_by="label"))) == [
        "input 'data.split.split_by' = 'label': is the label column; name a column of dates, times or numbers "
        """to split by, or leave it empty for a stratified random split; pass e.g. --data '{"split": {"split_by": ""}}'"""
    ]


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"split": {"val_fraction": 0.5}}, "input 'data.split.val_fraction' = 0.5: must be between 0 and 0.5"),
        ({"split": {"seed": -1}}, "input 'data.split.seed' = -1: must be from 0 to 4,294,967,295"),
        ({"split": {"problem_type": "numbers"}},
         "input 'data.split.problem_type' = 'numbers': not one of auto, classification, regression"),
        ({"dataset": "d.csv", "label_column": ""}, "input 'data.label_column' = '': must name the column"),
        ({"datset": "d.csv"}, "input 'data.datset': unknown field; did you mean 'dataset'?"),
        ({"split": {"seed": 1.5}}, "input 'data.split.seed' = 1.5: expected a whole number"),
    ],
)  # fmt: skip
def test_the_data_json_is_checked_strictly_by_the_one_table_of_rules(raw, message):
    """As pyflyte parses `--data`: a split refuses to be built from a bad value, so the rules read the
    JSON first."""
    with pytest.raises(InputError) as refused:
        DataConfig.from_json(json.dumps(raw))
    assert message in str(refused.value)
    assert DataConfig.from_json('{"dataset": "d.csv", "split": {"seed": 3}}') == DataConfig(
        "d.csv", split=SplitConfig(seed=3)
    )


def test_a_launched_data_literal_is_decoded_by_the_data_rules_where_the_task_decodes_it():
    """A remote launch's literal skips the command line's parser: the task's decoding refuses it, naming
    the field, where flytekit's own decoding drops an unknown key."""
    context = FlyteContextManager.current_context()
    with pytest.raises(InputError, match="input 'data.datset': unknown field; did you mean 'dataset'"):
        TypeEngine.to_python_value(context, msgpack_literal({"datset": "d.csv"}), DataConfig)
    with pytest.raises(InputError, match="input 'data.split.val_fraction' = 0.7"):
        TypeEngine.to_python_value(context, msgpack_literal({"split": {"val_fraction": 0.7}}), DataConfig)
    data = DataConfig("d.csv", split=SplitConfig(seed=3))
    literal = TypeEngine.to_literal(context, data, DataConfig, TypeEngine.to_literal_type(DataConfig))
    assert TypeEngine.to_python_value(context, literal, DataConfig) == data
    # A schedule's data names its label before a task fills in the dataset from the template.
    scheduled = msgpack_literal({"label_column": "answer"})
    assert TypeEngine.to_python_value(context, scheduled, DataConfig) == DataConfig(label_column="answer")
