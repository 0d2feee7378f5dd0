"""Training memory of any torch model: counted from the built model and measured by a probe on CPU.

Parameters, gradients and AdamW state come from the model's own tensors. Activations are measured:
a forward and backward pass of a few random rows on CPU, recording every tensor storage the ops
allocate and free (what autograd saves, and the backward pass's temporaries). Run at two row counts,
each allocation's growth is its per-row cost; replaying the step with those costs gives the peak
per row, scaled to the micro-batch. What does not grow with the batch (parameter gradients, the
parameters' half-precision copies under autocast) is counted with the parameters instead. The
result is a `tasks.core.models.memory.ModelFootprint`.

Measured on CPU: under mixed precision the probe runs CPU autocast in bfloat16, whose op list and
dropout masks are close to, not the same as, CUDA's.
"""

from __future__ import annotations

import contextlib
import weakref
from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._pytree import tree_leaves

from tasks.core.models.memory import ModelFootprint
from tasks.core.models.plugins import InputSpec
from tasks.core.models.precision import named
from tasks.core.models.torch_startup import EagerDispatchMode

PROBE_ROWS = 8


class AllocationTimeline(EagerDispatchMode):
    """Tensor storage the ops run under it allocate and free, in order.

    Views and in-place results share their input's storage and allocate nothing; a storage is freed
    when the last tensor using it is gone."""

    def __init__(self) -> None:
        super().__init__()
        self.users: dict[int, int] = {}  # storage address -> live tensors using it
        self.allocation: dict[int, int] = {}  # storage address -> its entry in `allocations`
        self.allocations: list[int] = []  # bytes, by allocation
        self.events: list[tuple[int, int]] = []  # (allocation, +1 allocated / -1 freed)
        self.surviving: set[int] = set()  # allocations still live when the timeline closed

    def __exit__(self, *exc):
        self.surviving = set(self.allocation.values())
        self.users.clear()  # later frees are not part of the timeline
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        inputs = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs)) if is_tensor(t)}
        for tensor in tree_leaves(result):
            if is_tensor(tensor):
                self.track(tensor, inputs)
        return result

    def track(self, tensor: torch.Tensor, inputs: set[int]) -> None:
        address = tensor.untyped_storage().data_ptr()
        if address not in self.users:
            if address in inputs or address == 0:
                return  # a view of, or in-place on, a tensor made outside the timeline
            self.allocation[address] = len(self.allocations)
            self.allocations.append(tensor.untyped_storage().nbytes())
            self.events.append((self.allocation[address], 1))
            self.users[address] = 0
        self.users[address] += 1
        weakref.finalize(tensor, self.release, address)

    def release(self, address: int) -> None:
        if address not in self.users:
            return
        self.users[address] -= 1
        if not self.users[address]:
            del self.users[address]
            self.events.append((self.allocation.pop(address), -1))

    def peak_bytes(self, sizes: list[float]) -> float:
        """The most bytes live at once, were allocation i `sizes[i]` bytes; allocations still live
        when the timeline closed (parameter gradients) are left out."""
        live = peak = 0.0
        for allocation, sign in self.events:
            if allocation not in self.surviving:
                live += sign * sizes[allocation]
                peak = max(peak, live)
        return peak


def is_tensor(value: object) -> bool:
    return isinstance(value, torch.Tensor)


def activation_bytes_per_row(model: nn.Module, input_spec: InputSpec, precision: str = "fp32") -> float:
    """The training step replayed with each allocation's growth per row.

    The step runs at two row counts; each allocation's size difference is its per-row cost. What
    does not grow with the batch (the parameters' half-precision copies under autocast, weight
    gradients) drops out, and the peak is found where the batch-sized tensors peak, which a few
    probe rows alone would not show: there the weight gradients dominate."""
    small = step_timeline(model, input_spec, PROBE_ROWS, precision)
    large = step_timeline(model, input_spec, 2 * PROBE_ROWS, precision)
    if small.events != large.events:  # the ops depend on the batch size: compare the two peaks
        return max(large.peak_bytes(large.allocations) - small.peak_bytes(small.allocations), 0) / PROBE_ROWS
    growth = [
        (big - little) / PROBE_ROWS for little, big in zip(small.allocations, large.allocations, strict=True)
    ]
    return small.peak_bytes(growth)


def step_timeline(model: nn.Module, input_spec: InputSpec, rows: int, precision: str) -> AllocationTimeline:
    """The allocations of one forward and backward pass of `rows` random rows, in `precision`
    (a name of `tasks.core.models.precision.TABLE`)."""
    mixed = named(precision).mixed
    generator = torch.Generator().manual_seed(0)
    features = torch.randn(rows, input_spec.n_features, generator=generator)
    if input_spec.regression:  # the training loops' loss for a number: the squared error
        labels = torch.randn(rows, generator=generator)
        step_loss = lambda outputs: F.mse_loss(outputs[:, 0], labels)  # noqa: E731
    else:
        labels = torch.randint(0, input_spec.n_classes, (rows,), generator=generator)
        step_loss = lambda outputs: F.cross_entropy(outputs, labels)  # noqa: E731
    was_training = model.training
    model.train()
    timeline = AllocationTimeline()
    with timeline:
        with autocast(mixed):
            loss = step_loss(model(features).float())
        loss.backward()
        del loss
    model.zero_grad(set_to_none=True)
    model.train(was_training)
    return timeline


def autocast(mixed: bool):
    """CPU autocast computes in bfloat16 only; fp16 takes the same two bytes per value."""
    return torch.autocast("cpu", dtype=torch.bfloat16) if mixed else contextlib.nullcontext()


def measure_state(model: nn.Module) -> ModelFootprint:
    """The parameter side of a footprint (no activations)."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    tensors = [*model.parameters(), *model.buffers()]
    return ModelFootprint(
        state_bytes=sum(t.numel() * t.element_size() for t in tensors),
        trainable_bytes=sum(p.numel() * p.element_size() for p in trainable),
        trainable_count=sum(p.numel() for p in trainable),
        activation_bytes_per_row=0.0,
        n_features=0,
        precision="fp32",
    )


def probe_footprint(model: nn.Module, input_spec: InputSpec, precision: str = "fp32") -> ModelFootprint:
    """Parameters counted, activations probed on CPU; build the model fresh for it."""
    return replace(
        measure_state(model),
        activation_bytes_per_row=activation_bytes_per_row(model, input_spec, precision),
        n_features=input_spec.n_features,
        precision=precision,
    )
