"""Peak training memory of the MLP, estimated from its shape before any accelerator is requested.

The estimate counts what the training loop keeps on the device: fp32 parameters, gradients
and AdamW's two moment buffers, the optimizer step's temporaries, the activations autograd
saves per sample times the micro-batch, the training/validation shard (the loop moves its shard
to the device once), and, under mixed precision, the autocast copies of the weights. On top of
that, `overhead_bytes` covers what the framework holds outside tensors (CUDA context, allocator
slack); it is not part of what `torch.cuda.max_memory_allocated` reports.
"""

from __future__ import annotations

from dataclasses import dataclass

from tasks.core.config import ModelConfig

FP32, HALF, MASK = 4, 2, 1
CUDA_CONTEXT_BYTES = 600 * 2**20
ALLOCATOR_SLACK = 0.10
TF_RUNTIME_BYTES = 1024 * 2**20


@dataclass
class MemoryEstimate:
    """Bytes, by what holds them."""

    parameters: int
    gradients: int
    optimizer_state: int
    optimizer_temporaries: int
    activations: int
    data: int
    autocast_weights: int
    overhead_bytes: int

    @property
    def tensor_bytes(self) -> int:
        """Comparable with the allocator's own peak (e.g. `torch.cuda.max_memory_allocated`)."""
        return (
            self.parameters + self.gradients + self.optimizer_state + self.optimizer_temporaries
            + self.activations + self.data + self.autocast_weights
        )  # fmt: skip

    @property
    def total_bytes(self) -> int:
        return self.tensor_bytes + self.overhead_bytes

    @property
    def total_gib(self) -> float:
        return self.total_bytes / 2**30


def parameter_count(model: ModelConfig) -> int:
    widths = [model.n_features, *model.hidden_sizes, model.n_classes]
    return sum(fan_in * fan_out + fan_out for fan_in, fan_out in zip(widths, widths[1:], strict=False))


def activation_bytes_per_sample(model: ModelConfig, activation_bytes: int) -> int:
    """What autograd keeps per sample: each hidden layer's Linear output, ReLU output, Dropout
    output and mask; the logits and their log-softmax in fp32; the (autocast) input copy."""
    hidden = sum(width * (3 * activation_bytes + MASK) for width in model.hidden_sizes)
    logits = 2 * model.n_classes * FP32
    inputs = model.n_features * activation_bytes
    return hidden + logits + inputs


def estimate_training_memory(
    model: ModelConfig,
    micro_batch: int,
    resident_rows: int = 0,
    mixed_precision: bool = False,
    framework: str = "torch",
    on_accelerator: bool = True,
) -> MemoryEstimate:
    """Peak memory of one worker/replica training `model` with `micro_batch` rows per step.

    `resident_rows` are the dataset rows kept on the device (this worker's train + val shard).
    """
    params = parameter_count(model)
    activation = HALF if mixed_precision else FP32
    overhead = 0
    if on_accelerator:
        overhead = CUDA_CONTEXT_BYTES if framework == "torch" else TF_RUNTIME_BYTES
    estimate = MemoryEstimate(
        parameters=params * FP32,
        gradients=params * FP32,
        optimizer_state=2 * params * FP32,
        # foreach AdamW allocates up to two parameter-sized temporaries in its step.
        optimizer_temporaries=2 * params * FP32,
        activations=micro_batch * activation_bytes_per_sample(model, activation),
        data=resident_rows * (model.n_features * FP32 + 8),
        autocast_weights=params * HALF if mixed_precision else 0,
        overhead_bytes=overhead,
    )
    estimate.overhead_bytes += int(ALLOCATOR_SLACK * estimate.tensor_bytes) if on_accelerator else 0
    return estimate
