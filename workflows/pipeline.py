"""preprocess (CPU) -> train (GPU: PyTorch DDP, or TPU/GPU: TensorFlow) -> evaluate (CPU)."""

from __future__ import annotations

from flytekit import conditional, workflow

from tasks.evaluate import evaluate
from tasks.preprocess import preprocess
from tasks.train_tf import train_tf_gpu, train_tf_tpu
from tasks.train_torch import train_torch, train_torch_multinode
from tasks.types import EvaluationReport

TARGETS = ("gpu", "gpu-multinode", "tpu", "gpu-tf")


@workflow
def training_pipeline(
    dataset: str = "",
    label_column: str = "label",
    target: str = "gpu",
    epochs: int = 30,
    batch_size: int = 64,
    learning_rate: float = 3e-3,
    weight_decay: float = 1e-2,
    grad_accum_steps: int = 1,
    hidden_sizes: list[int] = [256, 128],  # noqa: B006 - Flyte needs the literal default
    dropout: float = 0.1,
    val_fraction: float = 0.15,
    test_fraction: float = 0.15,
    seed: int = 0,
    precision: str = "auto",
    tf_strategy: str = "auto",
) -> EvaluationReport:
    """Train a classifier on a table and report test accuracy, macro-F1 and per-class counts.

    Args:
        dataset: parquet or CSV file (local path or fsspec URI such as s3://, gs://); empty
            means the embedded handwritten digits dataset.
        label_column: column holding the class; every other column is a numeric feature.
        target: gpu (PyTorch DDP on one GPU node), gpu-multinode (PyTorch DDP as a Kubeflow
            PyTorchJob over several nodes), tpu (TensorFlow on a TPU slice) or gpu-tf
            (TensorFlow MirroredStrategy on GPUs). Locally all of them run on CPU.
        epochs: passes over the training split.
        batch_size: global batch per optimizer step, split over the workers/replicas.
        learning_rate: AdamW learning rate.
        weight_decay: AdamW weight decay.
        grad_accum_steps: micro-batches accumulated per optimizer step.
        hidden_sizes: widths of the MLP's hidden layers.
        dropout: dropout after each hidden layer.
        val_fraction: share of rows held out for validation.
        test_fraction: share of rows held out for the final test.
        seed: seeds the split, the initialisation and the shuffling.
        precision: auto (bf16 autocast on CUDA where supported, else fp16; bf16 on TPU), bf16,
            fp16 or fp32; CPU runs always train in fp32.
        tf_strategy: TensorFlow targets only: auto (TPU, then TF_CONFIG multi-worker, then GPUs,
            then the default strategy), or tpu, multi_worker, mirrored, default to demand one and
            fail if it is not there.
    """
    prepared = preprocess(
        dataset=dataset,
        label_column=label_column,
        val_fraction=val_fraction,
        test_fraction=test_fraction,
        seed=seed,
    )
    hyper = dict(
        prepared=prepared, epochs=epochs, batch_size=batch_size, learning_rate=learning_rate,
        weight_decay=weight_decay, grad_accum_steps=grad_accum_steps, hidden_sizes=hidden_sizes,
        dropout=dropout, seed=seed, precision=precision,
    )  # fmt: skip
    trained = (
        conditional("train_on_target")
        .if_(target == "gpu")
        .then(train_torch(**hyper))
        .elif_(target == "gpu-multinode")
        .then(train_torch_multinode(**hyper))
        .elif_(target == "tpu")
        .then(train_tf_tpu(**hyper, tf_strategy=tf_strategy))
        .elif_(target == "gpu-tf")
        .then(train_tf_gpu(**hyper, tf_strategy=tf_strategy))
        .else_()
        .fail(f"unknown target; valid targets are: {', '.join(TARGETS)}")
    )
    return evaluate(prepared=prepared, trained=trained)
