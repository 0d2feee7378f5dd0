"""plan + preprocess (CPU) -> plan + train (GPU: PyTorch DDP, or TPU/GPU: TensorFlow) -> evaluate (CPU)."""

from __future__ import annotations

from typing import NamedTuple

from flytekit import workflow
from flytekit.types.directory import FlyteDirectory

from tasks.core.data.config import DataConfig
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
    data: DataConfig = DataConfig(),  # noqa: B008 - Flyte needs the literal default
    target: str = "gpu",
    hyperparameters: TrainConfig = TrainConfig(),  # noqa: B008 - Flyte needs the literal default
    plan_resources: bool = True,
    publish_to: str = "",
    promotion: PromotionPolicy = ALWAYS,
    int8_export: bool = False,
) -> TrainingOutputs:
    """Train a classifier or a regression on a table; return the model bundle and the test metrics it
    scores (accuracy, macro-F1 and per-class counts; or RMSE, MAE and R² beside the train mean's).

    Args:
        data: the table and how it is split (tasks/core/data/config.py, DataConfig; docs/inputs.md); as
            JSON, only the fields that differ from the defaults, e.g.
            '{"dataset": "data/iris.csv", "label_column": "species"}'. dataset: parquet or CSV file, a
            folder of part files, or any fsspec URI (s3://, gs://); empty means the embedded handwritten
            digits. label_column: the column predicted; every other column is a feature: numbers, text
            categories, booleans or dates, missing values allowed. column_kinds: a column's kind where
            the guess from its type is wrong, or 'drop' to leave it out, e.g. {"zip": "categorical"};
            kinds: numeric, categorical, boolean, date, text. split: val_fraction and test_fraction (0.15
            each), seed, split_by (a column of dates, times or numbers: the earliest rows train, the
            latest test, instead of a stratified random split) and problem_type (auto, classification
            or regression: auto decides from the label and the report says why).
        target: gpu (PyTorch DDP on one GPU node), gpu-multinode (PyTorch DDP as a Kubeflow
            PyTorchJob over several nodes), tpu (TensorFlow on a TPU slice) or gpu-tf
            (TensorFlow MirroredStrategy on GPUs). Locally all of them run on CPU.
        hyperparameters: epochs, batch size, optimizer, model shape, precision, seed, checkpointing
            (tasks/core/training/config.py, TrainConfig); as JSON, only the fields that differ from the
            defaults, e.g. '{"epochs": 5, "batch_size": 128}'.
        plan_resources: estimate peak training memory from the prepared data and the model, and run
            preprocessing and training on the cheapest catalog option that holds it (MIG slice, GPU
            or TPU slice); fails before any accelerator is requested if nothing fits. Off: use the
            hardware declared in tasks/hardware.py (the plan is still reported).
        publish_to: a URI prefix (e.g. s3://bucket/models/digits); the bundle is copied to
            `<prefix>/<version>/` and `<prefix>/LATEST` then names that version (as `promotion` decides),
            for batch_predict and the scheduled scoring. Empty: not published.
        promotion: with publish_to, whether LATEST moves to the new version: by default always; a
            policy given defaults to the gate, which moves it only when the new model's metric on this
            run's test split is at least the current LATEST's less the tolerance, e.g.
            '{"metric": "accuracy", "tolerance": 0.01}'; a regression's RMSE at most the current one's
            plus rmse_tolerance of it (docs/scoring.md#promotion-gate). The version
            is published either way; the decision is printed with both figures.
        int8_export: also write model.int8.onnx (dense layers' weights in int8), kept only where its
            test accuracy is within 0.005 of the float file's and it scores faster on CPU
            (docs/serving.md#optional-int8-onnx-export).
    """
    prepared, preprocess_plan = prepare_data(
        data=data, target=target, hyperparameters=hyperparameters, plan_resources=plan_resources,
        publish_to=publish_to, promotion=promotion,
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
