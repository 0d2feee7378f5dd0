"""Right-sizing per run: plan the hardware from the data and the model, then run the stage with it.

Both tasks are `@dynamic`: they run on a small CPU pod, decide, and launch the real task with
`with_overrides`, so no accelerator is requested until the plan says which one. They use the ml-cpu
image (CPU builds of both frameworks) because they reference the training tasks, whose plugin needs
torch to be constructed. Targets come from the one table in tasks/targets.py.
"""

from __future__ import annotations

import html
import importlib.metadata
import logging

from flytekit import Deck, Resources, dynamic

from tasks.core.config import ModelConfig
from tasks.core.data import BATCH_ROWS, EMBEDDED_DIGITS_LABEL, dataset_fingerprint, describe_input
from tasks.core.planner import (
    PlanError,
    PreprocessPlan,
    TrainingPlan,
    Workload,
    plan_preprocessing,
    plan_training,
)
from tasks.core.validation import RunInputs, validate_run
from tasks.decks import DECKS
from tasks.hardware import (
    EVALUATE_CPU,
    ML_CPU_IMAGE,
    TRAIN_GPU,
    accelerator_for,
    guaranteed,
    tpu_profile_for,
)
from tasks.logs import setup_logging
from tasks.preprocess import preprocess
from tasks.targets import TARGETS
from tasks.types import PreparedData, ResourcePlan, TrainedModel

log = logging.getLogger(__name__)
EMBEDDED_DIGITS_SHAPE = (1797, 65, 600_000)  # rows, columns, bytes as parquet
EMBEDDED_FINGERPRINT = f"embedded-digits-scikit-learn-{importlib.metadata.version('scikit-learn')}"


def size_preprocessing(dataset: str, label_column: str) -> PreprocessPlan:
    if not dataset:
        if label_column != EMBEDDED_DIGITS_LABEL:  # preprocess says the same; fail before any pod starts
            raise ValueError(
                f"the embedded digits dataset has label column '{EMBEDDED_DIGITS_LABEL}', not '{label_column}'"
            )
        rows, columns, size = EMBEDDED_DIGITS_SHAPE
        return plan_preprocessing(size, rows, columns, BATCH_ROWS)
    stats = describe_input(dataset)
    return plan_preprocessing(stats.bytes, stats.rows, stats.columns, BATCH_ROWS)


@dynamic(container_image=ML_CPU_IMAGE, **guaranteed(EVALUATE_CPU), **DECKS)
def prepare_data(
    dataset: str,
    label_column: str,
    val_fraction: float,
    test_fraction: float,
    seed: int,
    plan_resources: bool,
    target: str,
    epochs: int,
    batch_size: int,
    learning_rate: float,
    grad_accum_steps: int,
    hidden_sizes: list[int],
    dropout: float,
    precision: str,
    tf_strategy: str,
) -> tuple[PreparedData, PreprocessPlan]:
    """Check every input, size the preprocessing pod from the input's metadata, then preprocess.

    Runs first and on CPU, so a bad input fails here, before any accelerator is requested.
    """
    setup_logging()
    validate_run(
        RunInputs(
            target=target, epochs=epochs, batch_size=batch_size, learning_rate=learning_rate,
            grad_accum_steps=grad_accum_steps, hidden_sizes=hidden_sizes, dropout=dropout,
            val_fraction=val_fraction, test_fraction=test_fraction, precision=precision, tf_strategy=tf_strategy,
        ),
        targets=TARGETS,
    )  # fmt: skip
    plan = size_preprocessing(dataset, label_column)
    log.info(
        "preprocess plan: %s CPU, %s for %d rows x %d columns",
        plan.cpu,
        plan.mem,
        plan.input_rows,
        plan.input_columns,
    )
    prepared = preprocess(
        dataset=dataset,
        label_column=label_column,
        val_fraction=val_fraction,
        test_fraction=test_fraction,
        seed=seed,
        dataset_fingerprint=dataset_fingerprint(dataset) if dataset else EMBEDDED_FINGERPRINT,
    )
    if plan_resources:
        sized = Resources(cpu=plan.cpu, mem=plan.mem)
        prepared = prepared.with_overrides(requests=sized, limits=sized)
    return prepared, plan


def workload(prepared: PreparedData, target: str, hyper: dict) -> Workload:
    model = ModelConfig(
        len(prepared.feature_names), len(prepared.class_labels), hyper["hidden_sizes"], hyper["dropout"]
    )
    return Workload(
        model=model,
        batch_size=hyper["batch_size"],
        grad_accum_steps=hyper["grad_accum_steps"],
        train_rows=prepared.rows["train"],
        val_rows=prepared.rows["val"],
        mixed_precision=hyper["precision"] != "fp32",
        framework=TARGETS[target].framework,
    )


def to_report(
    plan: TrainingPlan, applied: bool, target: str, framework: str, preprocess_plan
) -> ResourcePlan:
    choice = plan.choice
    return ResourcePlan(
        applied=applied, target=target, framework=framework, choice=choice.name, device=choice.device,
        partition=choice.partition, devices=choice.devices, memory_gib=choice.memory_gib,
        price_per_hour=choice.price_per_hour, estimated_peak_gib=plan.estimated_peak_gib, estimate=plan.estimate,
        micro_batch_size=plan.micro_batch_size, grad_accum_steps=plan.grad_accum_steps,
        effective_batch_size=plan.effective_batch_size, options=plan.options, preprocess=preprocess_plan,
        notes=plan.notes,
    )  # fmt: skip


def declared_report(target: str, framework: str, hyper: dict, preprocess_plan, note: str) -> ResourcePlan:
    return ResourcePlan(
        applied=False, target=target, framework=framework, choice="declared in tasks/hardware.py", device="",
        partition="", devices=TRAIN_GPU.gpus_per_node, memory_gib=0.0, price_per_hour=0.0, estimated_peak_gib=0.0,
        estimate=None, micro_batch_size=0, grad_accum_steps=hyper["grad_accum_steps"],
        effective_batch_size=hyper["batch_size"], options=[], preprocess=preprocess_plan, notes=[note],
    )  # fmt: skip


def overrides_for(plan: TrainingPlan) -> dict:
    """Node overrides that put the training task on the planned hardware."""
    choice = plan.choice
    accelerator = accelerator_for(choice)
    if choice.kind == "tpu":
        return {"accelerator": accelerator, "pod_template": tpu_profile_for(choice).pod_template()}
    sized = Resources(cpu=TRAIN_GPU.cpu, mem=TRAIN_GPU.mem, gpu=str(choice.devices))
    return {"accelerator": accelerator, "requests": sized, "limits": sized}


def plan_deck(report: ResourcePlan) -> None:
    Deck("Resource plan", f"<pre>{html.escape(report.summary())}</pre>")


@dynamic(
    container_image=ML_CPU_IMAGE,
    **guaranteed(EVALUATE_CPU),
    **DECKS,
)
def train_on_target(
    prepared: PreparedData,
    preprocess_plan: PreprocessPlan,
    target: str,
    epochs: int,
    batch_size: int,
    learning_rate: float,
    weight_decay: float,
    grad_accum_steps: int,
    hidden_sizes: list[int],
    dropout: float,
    seed: int,
    precision: str,
    tf_strategy: str,
    plan_resources: bool,
    checkpoint_every_steps: int = 0,
) -> tuple[TrainedModel, ResourcePlan]:
    """Estimate memory, pick the cheapest accelerator that holds it, and train there."""
    setup_logging()
    hyper = dict(
        epochs=epochs, batch_size=batch_size, learning_rate=learning_rate, weight_decay=weight_decay,
        grad_accum_steps=grad_accum_steps, hidden_sizes=hidden_sizes, dropout=dropout, seed=seed, precision=precision,
        checkpoint_every_steps=checkpoint_every_steps,
    )  # fmt: skip
    work = workload(prepared, target, hyper)
    report, overrides = plan_report(target, work, hyper, preprocess_plan, plan_resources)
    log.info("%s", report.summary())
    plan_deck(report)
    if report.applied:
        hyper["grad_accum_steps"] = report.grad_accum_steps
    extra = {"tf_strategy": tf_strategy} if TARGETS[target].framework == "tensorflow" else {}
    trained = TARGETS[target].task(prepared=prepared, **hyper, **extra)
    if overrides:
        trained = trained.with_overrides(**overrides)
    return trained, report


def plan_report(target: str, work: Workload, hyper: dict, preprocess_plan, plan_resources: bool):
    """(ResourcePlan, node overrides). Raises PlanError when planning is on and nothing fits."""
    catalog = TARGETS[target].catalog
    if catalog is None:
        note = f"target {target} keeps its declared multi-node profile; the planner sizes single-node targets"
        return declared_report(target, work.framework, hyper, preprocess_plan, note), {}
    try:
        plan = plan_training(work, catalog)
    except PlanError as error:
        if plan_resources:
            raise
        return declared_report(
            target, work.framework, hyper, preprocess_plan, f"planning skipped: {error}"
        ), {}
    report = to_report(plan, plan_resources, target, work.framework, preprocess_plan)
    return report, overrides_for(plan) if plan_resources else {}
