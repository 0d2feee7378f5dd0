"""Memory estimate against measurement, and the planner's choices."""

from __future__ import annotations

import json
import re
import warnings
from collections import OrderedDict
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from flytekit import workflow
from flytekit.configuration import ImageConfig, SerializationSettings
from flytekit.tools.translator import get_serializable

from tasks.catalog import GPU_CATALOG, GPU_OPTIONS, TPU_CATALOG, TPU_OPTIONS, offered
from tasks.core.data.config import DataConfig
from tasks.core.models.memory import (
    ESTIMATE_HIGH,
    ESTIMATE_LOW,
    GRADIENT_REDUCE_BUCKET_BYTES,
    NCCL_BYTES,
    ModelFootprint,
)
from tasks.core.models.plugins import build, measure_footprint, mlp_spec
from tasks.core.planning.planner import PlanError, Workload, estimate_for, plan_preprocessing, plan_training
from tasks.core.training.config import TrainConfig
from tasks.hardware import CPU_NODE

MIB = 2**20


def measured_peak_bytes(make_model, n_features: int, n_classes: int, micro_batch: int, tmp_path) -> int:
    """Peak CPU tensor memory of two AdamW steps of `make_model()`, from the torch profiler's memory
    timeline."""
    torch.manual_seed(0)
    x = torch.randn(2 * micro_batch, n_features)
    y = torch.randint(0, n_classes, (2 * micro_batch,))
    activities = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(
        activities=activities, profile_memory=True, record_shapes=True, with_stack=True
    ) as prof:
        model = make_model()
        optimizer = torch.optim.AdamW(model.parameters())
        for batch in (slice(0, micro_batch), slice(micro_batch, 2 * micro_batch)):
            F.cross_entropy(model(x[batch]).float(), y[batch]).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    path = tmp_path / "timeline.json"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        prof.export_memory_timeline(str(path), device="cpu")
    _, sizes = json.loads(path.read_text())
    return max(sum(row[:-1]) for row in sizes)  # the last column is memory the profiler could not attribute


def mlp_estimate(n_features: int, n_classes: int, hidden: list[int], micro_batch: int, **where):
    """What the planner prices the built-in MLP at: `models.measure_footprint`, the probe it runs."""
    footprint = measure_footprint(mlp_spec(hidden, 0.1), n_features, n_classes, "pytorch", precision="fp32")
    return footprint.estimate(micro_batch, **where)


@pytest.mark.slow  # measures a real allocation: two AdamW steps under the torch profiler
@pytest.mark.parametrize(
    "n_features, n_classes, hidden, micro_batch",
    [(512, 10, [2048, 2048], 256), (1024, 10, [1024, 1024], 128), (1024, 100, [4096, 4096], 512)],
    ids=["5M-params", "3M-params", "21M-params"],
)
def test_estimate_matches_measured_cpu_allocation(n_features, n_classes, hidden, micro_batch, tmp_path):
    measured = measured_peak_bytes(
        lambda: build(mlp_spec(hidden, 0.1), n_features, n_classes, "pytorch"),
        n_features,
        n_classes,
        micro_batch,
        tmp_path,
    )
    estimate = mlp_estimate(n_features, n_classes, hidden, micro_batch, on_accelerator=False)
    assert ESTIMATE_LOW * measured <= estimate.tensor_bytes <= ESTIMATE_HIGH * measured, (
        estimate.tensor_bytes,
        measured,
    )


def footprint(trainable_mib: float, activation_bytes_per_row: float) -> ModelFootprint:
    trainable = int(trainable_mib * MIB)
    return ModelFootprint(trainable, trainable, trainable // 4, activation_bytes_per_row, 16, "fp32")


def test_activations_optimizer_temporaries_and_the_reduce_bucket_never_add_up():
    """The activations are freed by the backward that the bucket reduce and the optimizer step follow."""
    for per_row, peak in ((64 * 1024, "optimizer_temporaries"), (MIB, "activations")):
        estimate = footprint(64, per_row).estimate(micro_batch=512, world_size=2)
        held = estimate.parameters + estimate.gradients + estimate.optimizer_state
        assert estimate.tensor_bytes == held + getattr(estimate, peak)
        assert estimate.gradient_reduce_bucket and estimate.activations and estimate.optimizer_temporaries


def test_ddp_adds_a_reduce_bucket_and_nccls_buffers_not_a_second_copy_of_the_gradients():
    model = footprint(64, 1024.0)
    alone, ranked = model.estimate(256), model.estimate(256, world_size=8)
    assert ranked.gradients == alone.gradients == model.trainable_bytes  # gradient_as_bucket_view
    assert (alone.gradient_reduce_bucket, alone.communication_bytes) == (0, 0)
    assert ranked.gradient_reduce_bucket == GRADIENT_REDUCE_BUCKET_BYTES < model.trainable_bytes
    assert footprint(4, 1024.0).estimate(256, world_size=8).gradient_reduce_bucket == 4 * MIB
    # NCCL allocates its buffers itself: beyond the allocator's peak, within the device's memory.
    assert ranked.tensor_bytes == alone.tensor_bytes
    assert ranked.total_bytes - ranked.communication_bytes == alone.total_bytes
    assert ranked.communication_bytes == NCCL_BYTES
    assert 512 * MIB <= NCCL_BYTES <= 1024 * MIB  # 32 channels x 2 peers x ~9.2 MiB, and the communicator


def test_ddp_terms_apply_to_torch_on_accelerators_only():
    model = footprint(64, 1024.0)
    gloo = model.estimate(256, on_accelerator=False, world_size=2)
    assert gloo.gradient_reduce_bucket and not gloo.communication_bytes  # the loop's bucket, no NCCL
    replicas = model.estimate(256, framework="tensorflow", world_size=4)
    assert (replicas.gradient_reduce_bucket, replicas.communication_bytes) == (0, 0)


def test_the_planner_estimates_an_option_with_its_world_size():
    work = workload([256, 128])
    (whole_l4,) = [entry for entry in GPU_CATALOG if entry.name == "l4"]
    two_l4 = replace(whole_l4, name="2x-l4", devices=2)
    assert estimate_for(work, whole_l4, 1).communication_bytes == 0
    assert estimate_for(work, two_l4, 1).communication_bytes == NCCL_BYTES


def workload(
    hidden: list[int], batch: int = 64, accum: int = 1, rows: int = 1257, features: int = 64
) -> Workload:
    footprint = measure_footprint(mlp_spec(hidden, 0.1), features, 10, "pytorch", precision="bf16")
    return Workload(footprint, batch, accum, rows, 270, "pytorch")


def test_small_default_model_gets_a_mig_slice():
    plan = plan_training(workload([256, 128]), GPU_CATALOG)
    assert plan.choice.kind == "mig" and plan.choice.name == "a100-mig-1g.5gb"
    assert (plan.micro_batch_size, plan.grad_accum_steps, plan.effective_batch_size) == (64, 1, 64)
    assert all(option.fits for option in plan.options)


def test_model_too_large_for_any_slice_gets_a_full_large_gpu():
    plan = plan_training(workload([20480, 20480, 20480], batch=256), GPU_CATALOG)
    slices = [o for o in plan.options if o.name.startswith("a100-mig") or o.name == "l4"]
    assert not any(o.fits for o in slices)
    assert plan.choice.kind == "gpu" and plan.choice.memory_gib >= 39
    assert plan.estimated_peak_gib <= plan.choice.memory_gib


def test_activations_that_do_not_fit_lower_the_micro_batch_not_the_effective_batch():
    big_batch = workload([4096], batch=262144, features=64)
    plan = plan_training(big_batch, [GPU_CATALOG[0]])  # only the 5 GB slice
    assert plan.grad_accum_steps > 1
    assert plan.micro_batch_size * plan.grad_accum_steps == plan.effective_batch_size == 262144
    assert "effective batch stays 262144" in plan.notes[0]


def test_the_micro_batch_is_lowered_no_further_than_the_runs_minimum():
    """One rule with the out-of-memory guard: `TrainConfig.min_micro_batch_size`, its default included."""
    assert workload([256]).min_micro_batch == TrainConfig().min_micro_batch_size
    big_batch = workload([4096], batch=262144)
    only_the_5gb_slice = [GPU_CATALOG[0]]
    assert plan_training(big_batch, only_the_5gb_slice).micro_batch_size == 65536
    with pytest.raises(PlanError, match="even at micro-batch 131072 "):
        plan_training(replace(big_batch, min_micro_batch=131072), only_the_5gb_slice)


def test_model_too_large_for_the_catalog_fails_saying_what_it_needs():
    with pytest.raises(PlanError, match=r"needs about \d+\.\d GiB per device .* largest option, h200-141gb"):
        plan_training(workload([98304, 98304]), GPU_OPTIONS)


def test_options_beyond_the_default_catalog_are_opt_in_and_unknown_names_fail():
    default = {entry.name for entry in offered(GPU_OPTIONS + TPU_OPTIONS, "")}
    more = {entry.name for entry in offered(GPU_OPTIONS, "a100-40gb, tpu-v6e-1x1")}
    assert more - default == {"a100-40gb"}  # a TPU name adds nothing to the GPU catalog
    assert "tpu-v6e-1x1" in {entry.name for entry in offered(TPU_OPTIONS, "a100-40gb tpu-v6e-1x1")}
    assert default < {entry.name for entry in GPU_OPTIONS + TPU_OPTIONS}
    with pytest.raises(ValueError, match=r"MIXEDML_EXTRA_OPTIONS: unknown options \['a100-96gb'\]"):
        offered(GPU_OPTIONS, "a100-96gb l4")


def test_tpu_plan_uses_the_tpu_catalog():
    plan = plan_training(workload([256, 128]), TPU_CATALOG)
    assert plan.choice.name == "tpu-v5e-1x1"


def test_preprocessing_is_sized_from_the_data():
    small = plan_preprocessing(600_000, 1797, 65, 65_536, CPU_NODE)
    large = plan_preprocessing(8 * 2**30, 100_000_000, 65, 65_536, CPU_NODE)
    assert (small.cpu, small.mem) == ("1", "1Gi")
    assert large.cpu == "4" and int(large.mem.removesuffix("Gi")) > 2


def test_preprocessing_memory_is_capped_at_the_largest_cpu_node():
    largest = int(CPU_NODE.allocatable_memory_gib)
    near_the_cap = plan_preprocessing(100 * 2**30, 1_500_000_000, 100, 65_536, CPU_NODE)
    assert near_the_cap.mem == f"{largest}Gi"  # without the cap, 1.25 x its need: over the node
    with pytest.raises(PlanError) as refused:
        plan_preprocessing(200 * 2**30, 2_000_000_000, 100, 65_536, CPU_NODE)
    message = str(refused.value)
    assert "2,000,000,000 rows x 100 columns (200.0 GiB)" in message
    needed = float(re.search(r"needs about (\d+\.\d) GiB of memory", message).group(1))
    assert (
        needed > largest
        and f"the largest CPU node, n2-standard-8, gives a pod at most {largest} GiB" in message
    )


def test_planned_overrides_reach_the_serialized_node():
    from tasks.preprocess import preprocess
    from tasks.targets import TARGETS

    plan = plan_training(workload([256, 128]), GPU_CATALOG)

    @workflow
    def planned(data: DataConfig = DataConfig()) -> None:  # noqa: B008 - Flyte needs the literal default
        prepared = preprocess(data=data)
        hyperparameters = TrainConfig(epochs=1, grad_accum_steps=plan.grad_accum_steps)
        gpu = TARGETS["gpu"]
        gpu.task(prepared=prepared, hyperparameters=hyperparameters).with_overrides(
            **gpu.profile.overrides_for(plan.choice)
        )

    images = {
        name: f"registry.example.com/mixedml-{name}:v1"
        for name in ("cpu", "ml-cpu", "torch-gpu", "tf-gpu", "tpu")
    }
    settings = SerializationSettings(image_config=ImageConfig.from_images(images["ml-cpu"], images))
    spec = get_serializable(OrderedDict(), settings, planned).template.to_flyte_idl()
    (train_node,) = [n for n in spec.nodes if "train_torch" in n.task_node.reference_id.name]
    overrides = train_node.task_node.overrides
    accelerator = overrides.extended_resources.gpu_accelerator
    assert (accelerator.device, accelerator.partition_size) == ("nvidia-tesla-a100", "1g.5gb")
    assert {r.value for r in overrides.resources.requests if r.name == 2} == {"1"}  # GPU
