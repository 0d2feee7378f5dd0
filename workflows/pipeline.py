"""plan + preprocess (CPU) -> plan + train (GPU: PyTorch DDP, or TPU/GPU: TensorFlow) -> evaluate (CPU)."""

from __future__ import annotations

from flytekit import workflow

from tasks.evaluate import evaluate
from tasks.planner import prepare_data, train_on_target
from tasks.types import EvaluationReport


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
    plan_resources: bool = True,
    checkpoint_every_steps: int = 0,
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
        plan_resources: estimate peak training memory from the prepared data and the model, and run
            preprocessing and training on the cheapest catalog option that holds it (MIG slice, GPU
            or TPU slice); fails before any accelerator is requested if nothing fits. Off: use the
            hardware declared in tasks/hardware.py (the plan is still reported).
        checkpoint_every_steps: also checkpoint every N optimizer steps, not only every epoch
            (0: every epoch). A retried attempt (spot preemption) resumes from the last one.
    """
    prepared, preprocess_plan = prepare_data(
        dataset=dataset, label_column=label_column, val_fraction=val_fraction, test_fraction=test_fraction,
        seed=seed, plan_resources=plan_resources, target=target, epochs=epochs, batch_size=batch_size,
        learning_rate=learning_rate, grad_accum_steps=grad_accum_steps, hidden_sizes=hidden_sizes, dropout=dropout,
        precision=precision, tf_strategy=tf_strategy,
    )  # fmt: skip
    trained, plan = train_on_target(
        prepared=prepared, preprocess_plan=preprocess_plan, target=target, epochs=epochs, batch_size=batch_size,
        learning_rate=learning_rate, weight_decay=weight_decay, grad_accum_steps=grad_accum_steps,
        hidden_sizes=hidden_sizes, dropout=dropout, seed=seed, precision=precision, tf_strategy=tf_strategy,
        plan_resources=plan_resources, checkpoint_every_steps=checkpoint_every_steps,
    )  # fmt: skip
    return evaluate(prepared=prepared, trained=trained, plan=plan)
