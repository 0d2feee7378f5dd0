"""CPU or GPU for the scoring pods, whichever costs less for the plan's rows at the measured cost per row."""

from __future__ import annotations

from tasks.core.planning.planner import CatalogEntry
from tasks.core.scoring.records import (
    GPU_MODEL_SPEEDUP,
    HARDWARE,
    POD_START_SECONDS,
    HardwareChoice,
    ScoringPlan,
)

# ---- CPU or GPU -----------------------------------------------------------------------------------------


def check_hardware(hardware: str) -> None:
    if hardware not in HARDWARE:
        raise ValueError(f"hardware={hardware!r} is not one of {', '.join(HARDWARE)}")


def cheapest_whole_gpu(options: list[CatalogEntry]) -> CatalogEntry | None:
    """Scoring considers whole GPUs: a MIG slice scores at its share of the speed for its share of the
    price, so it would only add start-up costs."""
    whole = [entry for entry in options if entry.kind == "gpu"]
    return min(whole, key=lambda entry: entry.price_per_hour) if whole else None


def choose_hardware(
    plan: ScoringPlan, cpu_price_per_hour: float, gpu_options: list[CatalogEntry], hardware: str = "auto"
) -> HardwareChoice:
    """The cheaper of CPU pods and the cheapest whole GPU for the plan's rows at the measured cost per row.

    CPU: the measured core-seconds at the per-core price. GPU: the same with the model's share over
    GPU_MODEL_SPEEDUP, at the GPU's price. Each mapped pod also pays its start. `hardware` "cpu" or
    "gpu" overrides the choice.
    """
    check_hardware(hardware)
    cpu_seconds = plan.rows * plan.row_cost.total
    pieces = len(plan.pieces)
    cpu_cost = (cpu_seconds + pieces * POD_START_SECONDS["cpu"]) * cpu_price_per_hour / 3600
    gpu = cheapest_whole_gpu(gpu_options)
    if gpu is None:
        if hardware == "gpu":
            raise ValueError("hardware='gpu', but the GPU catalog has no whole GPU to score on")
        return HardwareChoice("cpu", cpu_cost, 0.0, None, "no whole GPU in the catalog")
    gpu_seconds = plan.rows * plan.row_cost.on_gpu()
    gpu_cost = (gpu_seconds + pieces * POD_START_SECONDS["gpu"]) * gpu.price_per_hour / 3600
    use_gpu = hardware == "gpu" or (hardware == "auto" and gpu_cost < cpu_cost)
    device = gpu.name if use_gpu else "cpu"
    how = "cheaper" if hardware == "auto" else "asked for"
    reason = (
        f"{how}: {plan.rows:,} rows at {plan.row_cost.total * 1e6:.1f} us/row on a CPU core (the model "
        f"{plan.row_cost.model / plan.row_cost.total:.0%} of it) cost about ${cpu_cost:.4f} on CPU, "
        f"${gpu_cost:.4f} on {gpu.name} ({plan.row_cost.gpu_speedup():.1f}x a core: the model "
        f"{GPU_MODEL_SPEEDUP:g}x faster there, the rest as fast)"
    )
    return HardwareChoice(device, cpu_cost, gpu_cost, gpu, reason)
