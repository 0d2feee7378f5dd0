"""Every kind of bad input is refused with one clear message naming the input, and nothing is changed.

Each case is checked where the check lives: data cases against preprocessing, input cases against
validation. A few run through the whole workflow, one for each stage that checks (input validation,
preprocessing, planning, the launcher), to show that the failure comes before training and that the
message reaching the user still names the input.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tasks.core.data.assignment import SplitConfig
from tasks.core.data.config import DataConfig, input_problems, json_form
from tasks.core.data.files import DatasetError
from tasks.core.data.prepare import prepare_dataset
from tasks.core.models.plugins import ModelSpec
from tasks.core.planning.batches import micro_batch
from tasks.core.training.config import TrainConfig
from tasks.core.validation import batch_problems, data_problems, training_problems
from tasks.targets import TARGETS
from tests.conftest import blobs_frame


def write(tmp_path: Path, name: str, mutate=None) -> str:
    frame = blobs_frame(n_rows=120)
    if mutate:
        frame = mutate(frame)
    path = tmp_path / name
    frame.to_csv(path, index=False) if name.endswith(".csv") else frame.to_parquet(path, index=False)
    return str(path)


def late_text_csv(path: Path) -> str:
    """Numbers in f1 for far more rows than the block its type is guessed from, then text."""
    frame = blobs_frame(n_rows=60_000)
    frame["f1"] = frame["f1"].astype(object)
    frame.loc[59_990, "f1"] = "n/k"
    frame.to_csv(path, index=False)
    return str(path)


def garbage(tmp_path: Path) -> str:
    path = tmp_path / "broken.parquet"
    path.write_bytes(b"this is not parquet at all" * 10)
    return str(path)


def set_value(column: str, value):
    def mutate(frame):
        frame.loc[7, column] = value
        return frame

    return mutate


# name -> (dataset factory, label column, fragments the message must contain)
DATA_CASES = {
    "bad URI": (lambda t: "nosuchfs://bucket/data.parquet", "species",
                ["nosuchfs://bucket/data.parquet", "cannot open"]),
    "missing file": (lambda t: str(t / "absent.parquet"), "species", ["absent.parquet", "no such file"]),
    "unreadable file": (garbage, "species", ["broken.parquet", "cannot be read as parquet"]),
    "wrong format": (lambda t: write(t, "data.parquet").replace(".parquet", ".xlsx"), "species",
                     ["file format", ".csv"]),
    "label column missing": (lambda t: write(t, "d.parquet"), "kind", ["label column 'kind'"]),
    "feature of a type no kind reads": (
        lambda t: write(t, "d.parquet", lambda f: f.assign(blob=[b"\x00"] * len(f))), "species",
        ["d.parquet", "'blob' has type binary, which no feature kind reads"],
    ),
    "inf feature": (lambda t: write(t, "d.parquet", set_value("f3", np.inf)), "species",
                    ["'f3'", "an infinite value (inf) at row 7"]),
    "text in a numeric CSV column past the first block": (
        lambda t: late_text_csv(t / "d.csv"), "species", ["d.csv", "column 'f1' holds 'n/k'", "not a number"],
    ),
    "too few rows": (lambda t: write(t, "d.parquet", lambda f: f.iloc[:15]), "species", ["too few rows"]),
    "single class": (lambda t: write(t, "d.parquet", lambda f: f.assign(species="a")), "species",
                     ["single class"]),
}  # fmt: skip


def files_under(folder: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()}


@pytest.mark.parametrize("case", list(DATA_CASES))
def test_bad_data_is_refused_naming_the_file_and_column(case, tmp_path):
    make_dataset, label_column, fragments = DATA_CASES[case]
    dataset = make_dataset(tmp_path)
    before = files_under(tmp_path)
    with pytest.raises(ValueError) as error:
        prepare_dataset(dataset, label_column, str(tmp_path.parent / f"{tmp_path.name}-out"), SplitConfig())
    for fragment in fragments:
        assert fragment in str(error.value), str(error.value)
    assert files_under(tmp_path) == before  # nothing modified


# Inputs refused before features were encoded, which now prepare: name -> (dataset factory, the
# encoded features)
ENCODED_CASES = {
    "text feature": (lambda t: write(t, "d.parquet", lambda f: f.assign(f2=np.where(f.index % 2, "odd", "even"))),
                     ["f0", "f1", "f2=even", "f2=odd", "f2=<other>", "f3"]),
    "NaN feature": (lambda t: write(t, "d.csv", set_value("f1", np.nan)), ["f0", "f1", "f1<missing>", "f2", "f3"]),
}  # fmt: skip


@pytest.mark.parametrize("case", list(ENCODED_CASES))
def test_text_and_missing_feature_values_are_encoded_not_refused(case, tmp_path):
    make_dataset, encoded = ENCODED_CASES[case]
    prepared = prepare_dataset(make_dataset(tmp_path), "species", str(tmp_path / "out"), SplitConfig())
    assert sorted(prepared.table.feature_names) == sorted(encoded)


# name -> (target, hyperparameters, fragments the message must contain)
INPUT_CASES = {
    "zero epochs": ("gpu", TrainConfig(epochs=0),
                    ["input 'hyperparameters.epochs' = 0", "--hyperparameters '{\"epochs\": 30}'"]),
    "negative batch": ("gpu", TrainConfig(batch_size=-8), ["input 'hyperparameters.batch_size' = -8"]),
    "batch not divisible by accumulation": (
        "gpu", TrainConfig(batch_size=64, grad_accum_steps=3),
        ["input 'hyperparameters.grad_accum_steps' = 3", "divide batch_size (64)"],
    ),
    "unknown target": ("cuda", TrainConfig(), ["input 'target' = 'cuda'", "gpu, "]),
    "model neither built-in nor a reference": (
        "gpu", TrainConfig(model=ModelSpec("resnet")),
        ["input 'hyperparameters.model'", "model 'resnet' is neither a built-in (mlp, cnn)"],
    ),
    "model input shape": (
        "gpu", TrainConfig(model=ModelSpec("cnn", "8by8")),
        ["input 'hyperparameters.model'", "input_shape '8by8' is not positive dimensions"],
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", list(INPUT_CASES))
def test_bad_inputs_are_named_with_the_fix(case):
    target, hyperparameters, fragments = INPUT_CASES[case]
    (message,) = training_problems(target, hyperparameters, TARGETS)
    for fragment in fragments:
        assert fragment in message, message


def test_a_batch_must_split_over_the_workers_and_fit_the_training_rows():
    (uneven,) = batch_problems(TrainConfig(batch_size=63), world_size=2, train_rows=84)
    assert "input 'hyperparameters.batch_size' = 63" in uneven and "over 2 workers" in uneven
    assert '"batch_size": 62' in uneven
    (too_large,) = batch_problems(TrainConfig(batch_size=4096), world_size=1, train_rows=84)
    assert "input 'hyperparameters.batch_size' = 4096" in too_large
    assert "larger than the 84 training rows" in too_large
    assert batch_problems(TrainConfig(batch_size=64), world_size=2, train_rows=84) == []


# One case per stage that checks: name -> (dataset factory, extra inputs, fragments of the message)
WORKFLOW_CASES = {
    "preprocessing: inf feature": (
        DATA_CASES["inf feature"][0], {}, ["d.parquet", "'f3'", "an infinite value (inf) at row 7"],
    ),
    "validation: zero epochs": (
        lambda t: write(t, "d.parquet"), {"hyperparameters": TrainConfig(epochs=0)},
        ["input 'hyperparameters.epochs' = 0"],
    ),
    "planning: batch larger than the training rows": (
        lambda t: write(t, "d.parquet"), {"hyperparameters": TrainConfig(epochs=2, batch_size=4096)},
        ["input 'hyperparameters.batch_size' = 4096", "larger than the 84 training rows"],
    ),
    "model check: logits of the wrong shape": (
        lambda t: write(t, "d.parquet"),
        {"hyperparameters": TrainConfig(epochs=2, model=ModelSpec("tests.unit.models.test_builders:wrong_logits"))},
        ["model 'tests.unit.models.test_builders:wrong_logits' gave logits of shape [4, 0], expected [4, 3]"],
    ),
    "validation: an unknown column kind": (
        lambda t: write(t, "d.parquet"), {"data": {"column_kinds": {"f0": "words"}}},
        ["input 'data.column_kinds' = {'f0': 'words'}: 'f0': 'words': not a kind; a column's kind is one of "
         "numeric, categorical, boolean, date, text, drop", """--data '{"column_kinds": {"f0": "categorical"}}'"""],
    ),
    "validation: a split by the label column": (
        lambda t: write(t, "d.parquet"), {"data": {"split": SplitConfig(split_by="species")}},
        ["input 'data.split.split_by' = 'species': is the label column"],
    ),
    "preprocessing: a kind the column cannot be read as": (
        lambda t: write(t, "d.parquet"), {"data": {"column_kinds": {"f1": "date"}}},
        ["d.parquet", "'f1'", "date"],
    ),
    "preprocessing: a kind for a column the data lacks": (
        lambda t: write(t, "d.parquet"), {"data": {"column_kinds": {"zip": "categorical"}}},
        ["column kinds are given for 'zip', which are not feature columns of the data"],
    ),
    "validation: publish_to is a file": (
        lambda t: write(t, "d.parquet"), {"publish_to": "PUBLISH_TO_THE_DATA_FILE"},
        ["input 'publish_to' =", "d.parquet': is a file, not a folder to publish bundles under"],
    ),
    "launcher: batch not divisible over the workers": (
        lambda t: write(t, "d.parquet"),
        {"hyperparameters": TrainConfig(epochs=2, batch_size=63), "plan_resources": False},
        ["input 'hyperparameters.batch_size' = 63", "over 2 workers"],
    ),
}  # fmt: skip


@pytest.fixture
def no_training(monkeypatch):
    """Fail loudly if any case gets as far as training."""
    import torch.distributed.launcher.api

    from tasks import train_torch as train_torch_module

    def refuse(*args, **kwargs):
        raise AssertionError("training started although the input was bad")

    monkeypatch.setattr(train_torch_module, "train_with_ddp", refuse)
    monkeypatch.setattr(torch.distributed.launcher.api, "elastic_launch", refuse)  # no worker process either


@pytest.mark.slow
@pytest.mark.parametrize("case", list(WORKFLOW_CASES))
def test_the_workflow_fails_before_training_naming_the_input(case, tmp_path, no_training):
    from workflows.pipeline import training_pipeline

    make_dataset, extra, fragments = WORKFLOW_CASES[case]
    dataset = make_dataset(tmp_path)
    data = DataConfig(dataset, "species", **extra.get("data", {}))
    inputs = {"hyperparameters": TrainConfig(epochs=2), **extra, "data": data}
    if inputs.get("publish_to") == "PUBLISH_TO_THE_DATA_FILE":
        inputs["publish_to"] = dataset
    before = files_under(tmp_path)
    with pytest.raises(Exception) as error:
        training_pipeline(**inputs)
    message = str(error.value)
    assert "training started" not in message
    for fragment in fragments:
        assert fragment in message, message
    assert files_under(tmp_path) == before


@pytest.mark.parametrize(
    "batch_size, workers, accumulation", [(64, 2, 2), (63, 2, 1), (64, 3, 1), (48, 1, 5)]
)
def test_the_batch_split_rule_is_the_same_at_every_check(batch_size, workers, accumulation):
    config = TrainConfig(batch_size=batch_size, grad_accum_steps=accumulation)
    splits = micro_batch(batch_size, workers, accumulation) is not None
    assert splits == (batch_problems(config, workers, train_rows=10**6) == [])
    one_worker = micro_batch(batch_size, 1, accumulation) is not None
    assert one_worker == ("grad_accum_steps" not in config.problems())


@pytest.mark.parametrize("fraction", [0.0, 0.5, -0.1, float("nan"), 0.2])
def test_the_split_fractions_are_refused_alike_by_the_inputs_check_and_the_split(fraction):
    refused = input_problems(json_form({"split": {"test_fraction": fraction}}))
    try:
        SplitConfig(test_fraction=fraction)
    except DatasetError as error:
        (problem,) = refused
        rule = f"{fraction!r}: must be between 0 and 0.5 (exclusive)"
        assert f"input 'data.split.test_fraction' = {rule}" in problem
        assert f"test_fraction = {rule}" in str(error)
        assert """--data '{"split": {"test_fraction": 0.15}}'""" in problem
    else:
        assert refused == []


def test_another_label_column_for_the_embedded_digits_is_refused_naming_both():
    (problem,) = data_problems(DataConfig(label_column="target"))
    assert "input 'data.label_column' = 'target'" in problem
    assert "embedded digits dataset has label column 'label'; name your own dataset" in problem
    assert """--data '{"label_column": "label"}'""" in problem
    assert (
        data_problems(DataConfig(label_column="label"))
        == data_problems(DataConfig("d.parquet", "target"))
        == []
    )


def test_a_strategy_that_leaves_the_tpu_slice_idle_is_refused_before_any_pod():
    (problem,) = training_problems("tpu", TrainConfig(tf_strategy="mirrored"), TARGETS)
    assert "'hyperparameters.tf_strategy' = 'mirrored': the tpu target trains with TPUStrategy" in problem
    assert "--target gpu-tf" in problem
    assert training_problems("tpu", TrainConfig(tf_strategy="tpu"), TARGETS) == []
    assert training_problems("gpu-tf", TrainConfig(tf_strategy="mirrored"), TARGETS) == []
