"""plan + preprocess (CPU) -> plan + train (GPU: PyTorch DDP, or TPU/GPU: TensorFlow) -> evaluate (CPU)."""

from __future__ import annotations

from typing import NamedTuple

from flytekit import workflow
from flytekit.types.directory import FlyteDirectory

from tasks.core.publish.promotion import ALWAYS, PromotionPolicy
from tasks.core.training.config import TrainConfig
from tasks.evaluate import evaluate
from tasks.publish import publish_model
from tasks.right_sizing import prepare_data, train_on_target
from tasks.types import EvaluationReport

# What a run hands back: the report, the model bundle (tasks/core/bundle/) and, with publish_to, the
# URI it was published under.
TrainingOutputs = NamedTuple(  # noqa: UP014 - the functional form keeps the field types real classes for flytekit
    "TrainingOutputs", [("report", EvaluationReport), ("model", FlyteDirectory), ("published", str)]
)


@workflow
def training_pipeline(
    dataset: str = "",
    label_column: str = "label",
    target: str = "gpu",
    hyperparameters: TrainConfig = TrainConfig(),  # noqa: B008 - Flyte needs the literal default
    val_fraction: float = 0.15,
    test_fraction: float = 0.15,
    plan_resources: bool = True,
    publish_to: str = "",
    column_kinds: dict[str, str] = {},  # noqa: B006 - Flyte needs the literal default
    promotion: PromotionPolicy = ALWAYS,
    split_by: str = "",
    int8_export: bool = False,
    problem_type: str = "auto",
) -> TrainingOutputs:
    """Train a classifier or a regression on a table; return the model bundle and the test metrics it
    scores (accuracy, macro-F1 and per-class counts; or RMSE, MAE and R² beside the train mean's).

    Args:
        dataset: parquet or CSV file (local path or fsspec URI such as s3://, gs://); empty
            means the embedded handwritten digits dataset.
        label_column: column holding the class; every other column is a feature: numbers, text
            categories, booleans or dates, missing values allowed (docs/inputs.md).
        target: gpu (PyTorch DDP on one GPU node), gpu-multinode (PyTorch DDP as a Kubeflow
            PyTorchJob over several nodes), tpu (TensorFlow on a TPU slice) or gpu-tf
            (TensorFlow MirroredStrategy on GPUs). Locally all of them run on CPU.
        hyperparameters: epochs, batch size, optimizer, model shape, precision, seed, checkpointing
            (tasks/core/training/config.py, TrainConfig); as JSON, only the fields that differ from the
            defaults, e.g. '{"epochs": 5, "batch_size": 128}'.
        val_fraction: share of rows held out for validation.
        test_fraction: share of rows held out for the final test.
        plan_resources: estimate peak training memory from the prepared data and the model, and run
            preprocessing and training on the cheapest catalog option that holds it (MIG slice, GPU
            or TPU slice); fails before any accelerator is requested if nothing fits. Off: use the
            hardware declared in tasks/hardware.py (the plan is still reported).
        publish_to: a URI prefix (e.g. s3://bucket/models/digits); the bundle is copied to
            `<prefix>/<version>/` and `<prefix>/LATEST` then names that version (as `promotion` decides),
            for batch_predict and the scheduled scoring. Empty: not published.
        column_kinds: a column's kind where the guess from its type is wrong, or 'drop' to leave it
            out, e.g. '{"zip": "categorical", "notes": "drop"}'; kinds: numeric, categorical,
            boolean, date (docs/inputs.md).
        promotion: with publish_to, whether LATEST moves to the new version: by default always; a
            policy given defaults to the gate, which moves it only when the new model's metric on this
            run's test split is at least the current LATEST's less the tolerance, e.g.
            '{"metric": "accuracy", "tolerance": 0.01}'; a regression's RMSE at most the current one's
            plus rmse_tolerance of it (docs/scoring.md#promotion-gate). The version
            is published either way; the decision is printed with both figures.
        split_by: a column of dates, times or numbers: the earliest rows train, the next validate and
            the latest test (val_fraction and test_fraction of the rows), instead of a stratified
            random split; empty: random (docs/inputs.md#time-ordered-split).
        int8_export: also write model.int8.onnx (dense layers' weights in int8), kept only where its
            test accuracy is within 0.005 of the float file's and it scores faster on CPU
            (docs/serving.md#optional-int8-onnx-export).
        problem_type: auto (decided from the label: text and booleans are classes, fractional numbers
            a quantity, whole numbers by how many distinct values they hold; the report says which and
            why), classification or regression (docs/inputs.md#what-is-predicted).
    """
    prepared, preprocess_plan = prepare_data(
        dataset=dataset, label_column=label_column, val_fraction=val_fraction, test_fraction=test_fraction,
        target=target, hyperparameters=hyperparameters, plan_resources=plan_resources,
        column_kinds=column_kinds, publish_to=publish_to, promotion=promotion, split_by=split_by,
        problem_type=problem_type,
    )  # fmt: skip
    trained, plan = train_on_target(
        prepared=prepared, preprocess_plan=preprocess_plan, target=target, hyperparameters=hyperparameters,
        plan_resources=plan_resources,
    )  # fmt: skip
    evaluated = evaluate(prepared=prepared, trained=trained, plan=plan, int8_export=int8_export)
    published = publish_model(
        bundle=evaluated.model, prefix=publish_to, prepared=prepared, promotion=promotion
    )
    return evaluated.report, evaluated.model, published
