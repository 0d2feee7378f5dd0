"""Choosing hardware for a run: the cheapest catalog option whose memory holds the estimate.

Pure Python; `tasks/catalog.py` holds the catalogs and `tasks/hardware.py` turns a choice into Flyte resources.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from tasks.core.models.memory import MemoryEstimate, ModelFootprint
from tasks.core.planning.batches import MIN_MICRO_BATCH_SIZE, micro_batch
from tasks.core.planning.machines import MachineType

# Leave headroom for what the estimate does not see (fragmentation spikes, library workspaces).
USABLE_MEMORY_FRACTION = 0.9
# Where the torch loop may keep its training rows (`TrainConfig.data_placement`), in the order the
# planner tries them: on the device (fastest) when the shard fits beside the model, else streamed
# from the split's files, which holds a bounded buffer whatever the table's size.
AUTO_PLACEMENTS = ("device", "stream")


class PlanError(ValueError):
    """Nothing in the catalog can run this configuration; raised before any accelerator is asked for."""


@dataclass(frozen=True)
class CatalogEntry:
    """One hardware option: a MIG slice, a whole GPU, or a TPU slice."""

    name: str
    kind: str  # "mig", "gpu" or "tpu"
    device: str  # the accelerator name Flyte and the cluster use
    partition: str  # MIG partition or TPU topology; "" for a whole GPU
    memory_gib: float  # per device: per GPU, MIG slice or TPU chip
    devices: int  # data-parallel replicas it provides (GPUs or TPU chips)
    price_per_hour: float  # the whole option


@dataclass
class OptionFit:
    name: str
    memory_gib: float
    required_gib: float
    price_per_hour: float
    fits: bool


@dataclass
class TrainingPlan:
    choice: CatalogEntry
    estimate: MemoryEstimate
    estimated_peak_gib: float
    micro_batch_size: int
    grad_accum_steps: int
    effective_batch_size: int
    options: list[OptionFit]
    notes: list[str] = field(default_factory=list)
    data_placement: str = "device"  # where the torch loop keeps its training rows


@dataclass
class PreprocessPlan:
    input_bytes: int
    input_rows: int
    input_columns: int
    cpu: str
    mem: str  # of the pod that holds every row's label: the one pod, or the label scan of the pieces
    pieces: int = (
        1  # more than 1: the features are read by this many pods at once (tasks/core/data/pieces.py)
    )
    piece_mem: str = ""  # of each of those pods, which hold a few batches and no labels


@dataclass
class Workload:
    footprint: ModelFootprint  # the model's cost per worker, mixed precision included
    batch_size: int
    grad_accum_steps: int
    train_rows: int
    val_rows: int
    framework: str
    min_micro_batch: int = MIN_MICRO_BATCH_SIZE  # the run's `TrainConfig.min_micro_batch_size`
    data_placement: str = "auto"  # the run's `TrainConfig.data_placement`

    def placements(self) -> tuple[str, ...]:
        """The placements the planner may choose: the torch loop's, unless the run names one;
        the Keras loop keeps its rows where it always does (counted as on the device)."""
        if self.framework != "pytorch":
            return ("device",)
        return AUTO_PLACEMENTS if self.data_placement == "auto" else (self.data_placement,)


def estimate_for(
    workload: Workload, entry: CatalogEntry, accum: int, placement: str = "device"
) -> MemoryEstimate | None:
    """Per-device estimate on `entry` with the training rows at `placement`, or None if the batch
    does not split over it evenly. Only the "device" placement keeps the shard on the device."""
    micro = micro_batch(workload.batch_size, entry.devices, accum)
    if micro is None:
        return None
    resident = 0
    if placement == "device":
        resident = math.ceil(workload.train_rows / entry.devices) + math.ceil(
            workload.val_rows / entry.devices
        )
    return workload.footprint.estimate(
        micro, resident, workload.framework, on_accelerator=True, world_size=entry.devices
    )


def placed_estimate(workload: Workload, entry: CatalogEntry, accum: int) -> tuple[str, MemoryEstimate | None]:
    """The first placement whose estimate fits `entry`, with that estimate; else the last tried."""
    for placement in workload.placements():
        estimate = estimate_for(workload, entry, accum, placement)
        if fits(estimate, entry):
            break
    return placement, estimate


def fits(estimate: MemoryEstimate | None, entry: CatalogEntry) -> bool:
    return estimate is not None and estimate.total_gib <= entry.memory_gib * USABLE_MEMORY_FRACTION


def accumulation_steps(workload: Workload) -> list[int]:
    """The user's accumulation first, then doubling while the micro-batch stays >= the minimum."""
    steps, accum = [], workload.grad_accum_steps
    while workload.batch_size // accum >= workload.min_micro_batch or not steps:
        steps.append(accum)
        accum *= 2
    return steps


def plan_training(workload: Workload, catalog: list[CatalogEntry]) -> TrainingPlan:
    by_price = sorted(catalog, key=lambda entry: entry.price_per_hour)
    for accum in accumulation_steps(workload):
        placed = {entry.name: placed_estimate(workload, entry, accum) for entry in by_price}
        estimates = {name: estimate for name, (_, estimate) in placed.items()}
        fitting = [entry for entry in by_price if fits(estimates[entry.name], entry)]
        if fitting:
            plan = make_plan(workload, fitting[0], accum, estimates, by_price)
            plan.data_placement = placed[fitting[0].name][0]
            plan.notes += placement_notes(workload, fitting[0], plan.data_placement)
            return plan
    raise PlanError(too_large_message(workload, by_price))


def placement_notes(workload: Workload, choice: CatalogEntry, placement: str) -> list[str]:
    """Why the training rows go where they go, when the planner chose."""
    if len(workload.placements()) == 1:
        return []
    if placement == "device":
        return [f"training rows on the device: this rank's shard fits in {choice.name} beside the model"]
    return [
        f"training rows streamed from the split's files: {workload.train_rows:,} training rows do not "
        f"fit in {choice.name} beside the model, so each rank reads its part as the epoch goes"
    ]


def make_plan(workload, choice, accum, estimates, catalog) -> TrainingPlan:
    estimate = estimates[choice.name]
    options = [
        OptionFit(
            name=entry.name,
            memory_gib=entry.memory_gib,
            required_gib=estimates[entry.name].total_gib
            if estimates[entry.name]
            else -1.0,  # -1: batch does not split
            price_per_hour=entry.price_per_hour,
            fits=fits(estimates[entry.name], entry),
        )
        for entry in catalog
    ]
    notes = []
    if accum != workload.grad_accum_steps:
        notes.append(
            f"micro-batch lowered to fit: grad_accum_steps {workload.grad_accum_steps} -> {accum}, "
            f"effective batch stays {workload.batch_size}"
        )
    return TrainingPlan(
        choice=choice,
        estimate=estimate,
        estimated_peak_gib=estimate.total_gib,
        micro_batch_size=micro_batch(workload.batch_size, choice.devices, accum),
        grad_accum_steps=accum,
        effective_batch_size=workload.batch_size,
        options=options,
        notes=notes,
    )


def too_large_message(workload: Workload, catalog: list[CatalogEntry]) -> str:
    largest = max(catalog, key=lambda entry: entry.memory_gib)
    smallest_batch = workload.footprint.estimate(workload.min_micro_batch, 0, workload.framework)
    state_gib = (
        smallest_batch.parameters + smallest_batch.gradients + smallest_batch.optimizer_state
    ) / 2**30
    return (
        f"no accelerator in the catalog fits this model: it needs about {smallest_batch.total_gib:.1f} GiB per "
        f"device even at micro-batch {workload.min_micro_batch} ({state_gib:.1f} GiB of parameters, gradients and "
        f"AdamW state), but the largest option, {largest.name}, has {largest.memory_gib:.0f} GiB "
        f"({USABLE_MEMORY_FRACTION:.0%} usable). Shrink the model (its options) or add a larger accelerator to the catalog"
    )


def plan_preprocessing(
    input_bytes: int, rows: int, columns: int, batch_rows: int, node: MachineType
) -> PreprocessPlan:
    """CPU/memory for the streaming preprocess: labels and split assignment for every row, a few
    copies of one record batch, and the interpreter with pandas/pyarrow/scikit-learn loaded. Past
    PIECE_BYTES or PIECE_ROWS, pieces of about that size read the features (`preprocess_in_pieces`).

    The memory is capped at what `node`, the largest CPU node, can give a pod; a table that would
    need more raises PlanError."""
    per_row = 16 + 1  # label value (numeric or short string) + one byte of split assignment
    batch = 6 * min(rows, batch_rows) * columns * 8
    needed_gib = (PREPROCESS_BASE_BYTES + rows * per_row + batch) / 2**30
    largest_gib = math.floor(node.allocatable_memory_gib)
    if needed_gib > largest_gib:
        raise PlanError(
            f"preprocessing {rows:,} rows x {columns} columns ({input_bytes / 2**30:.1f} GiB) needs about "
            f"{needed_gib:.1f} GiB of memory, but the largest CPU node, {node.name}, gives a pod at most "
            f"{largest_gib} GiB: split the input into smaller tables, or add a larger CPU node pool and "
            "name it as CPU_NODE in tasks/hardware.py"
        )
    cpu = "1" if input_bytes < 256 * 2**20 else "2" if input_bytes < 4 * 2**30 else "4"
    pieces = preprocess_pieces(input_bytes, rows)
    piece_gib = (PREPROCESS_BASE_BYTES + batch) / 2**30
    return PreprocessPlan(
        input_bytes, rows, columns, cpu, pod_memory(needed_gib, largest_gib), pieces,
        pod_memory(piece_gib, largest_gib) if pieces > 1 else "",
    )  # fmt: skip


# The interpreter with pandas, pyarrow and scikit-learn loaded.
PREPROCESS_BASE_BYTES = 768 * 2**20
# Inputs larger than either are preprocessed in pieces of about that size, at most MAX_PIECES of
# them. Read when planning, so that a test may lower them.
PIECE_BYTES, PIECE_ROWS, MAX_PIECES = 2**30, 4_000_000, 64


def preprocess_pieces(input_bytes: int, rows: int) -> int:
    pieces = max(math.ceil(input_bytes / PIECE_BYTES), math.ceil(rows / PIECE_ROWS), 1)
    return min(pieces, MAX_PIECES)


def pod_memory(needed_gib: float, largest_gib: int) -> str:
    return f"{min(max(1, math.ceil(needed_gib * 1.25)), largest_gib)}Gi"
