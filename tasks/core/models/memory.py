"""Peak training memory of a model, estimated before any accelerator is requested.

A `ModelFootprint` is what a model costs per worker: its parameter side counted from the built model
and its activations per row, probed on CPU for any torch model by `tasks.core.models.probe`. The estimate
counts what the training loop keeps on the device: fp32 parameters, gradients and AdamW's two moment
buffers, the training/validation shard (when the rows are placed on the device; rows in host memory
or streamed from the files are not resident: `tasks.core.planning.planner.estimate_for`) and, under
mixed precision, the autocast copies of the weights; and the largest of three things that are never
live together: the activations autograd saves per sample times the micro-batch (forward and
backward), the optimizer step's temporaries (after the backward has freed the activations), and
under DDP the flat bucket the loop's guarded path all-reduces gradients in (between the two) and the
gradient copy of DDP's one rebuild of its buckets (at the first forward of the fast path, before
the activations; `tasks.core.training.torch_training`). DDP's wrapper views the gradients in its
buckets (`gradient_as_bucket_view`), so on either path they are held once: the fast path's
overlapped all-reduce reduces the buckets in place and needs no second gradient copy. On top of that,
`overhead_bytes` covers what the framework holds outside tensors (CUDA context, allocator slack) and
`communication_bytes` NCCL's buffers; neither is part of what `torch.cuda.max_memory_allocated`
reports.
"""

from __future__ import annotations

from dataclasses import dataclass

from tasks.core.models.precision import FP32 as FULL_PRECISION
from tasks.core.models.precision import named

FP32 = FULL_PRECISION.value_bytes  # the features, and the weights the optimizer updates, are float32
# How close the estimate's tensor bytes come to the allocator's measured peak (over parameters,
# gradients, optimizer state, activations and temporaries), as the tests and the GPU check hold it:
# up to 35% high (it picks hardware: erring high is the safe side; it counts two parameter-sized
# optimizer temporaries that foreach AdamW does not always hold at the peak), at most 10% low.
ESTIMATE_LOW, ESTIMATE_HIGH = 0.90, 1.35
CUDA_CONTEXT_BYTES = 600 * 2**20
ALLOCATOR_SLACK = 0.10
TF_RUNTIME_BYTES = 1024 * 2**20
# Under DDP the torch loop's guarded path all-reduces gradients itself, in flat buckets of at most this size.
GRADIENT_REDUCE_BUCKET_BYTES = 25 * 2**20
# DDP's buckets on the fast path (`ddp_bucket_cap_mb`): the gradient in about DDP_BUCKETS buckets, so
# that all but the last one's all-reduce overlaps the backward, none smaller than DDP_BUCKET_MIN_MIB
# (below about 1 MiB an all-reduce's fixed latency, tens of microseconds, outweighs its bytes on
# NVLink or a 100+ Gb/s network) nor larger than DDP's own default of 25 MiB.
DDP_BUCKETS, DDP_BUCKET_MIN_MIB, DDP_BUCKET_MAX_MIB = 8, 1.0, 25.0
# NCCL's device memory per rank, which it allocates itself (outside torch's allocator). Per channel
# and peer NCCL keeps one buffer per protocol: Simple (NCCL_BUFFSIZE, 4 MiB by default), LL128 (120
# elements x 640 threads x 8 steps x 8 bytes) and LL (8 lines x 512 threads x 8 steps x 16 bytes)
# (NCCL's src/init.cc, DEFAULT_*BUFFSIZE). Counted for NCCL's most channels (MAXCHANNELS, 32) and the
# two ring neighbours, plus an allowance for the communicator's own device structures and work queues.
NCCL_PROTOCOL_BUFFERS_BYTES = 4 * 2**20 + 120 * 640 * 8 * 8 + 8 * 512 * 8 * 16
NCCL_CHANNELS, NCCL_PEERS = 32, 2
NCCL_COMMUNICATOR_BYTES = 64 * 2**20
NCCL_BYTES = NCCL_CHANNELS * NCCL_PEERS * NCCL_PROTOCOL_BUFFERS_BYTES + NCCL_COMMUNICATOR_BYTES


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
    gradient_reduce_bucket: int = 0  # DDP only: the guarded path's flat bucket
    bucket_rebuild: int = 0  # DDP only: the gradient copy while DDP rebuilds its buckets, once
    communication_bytes: int = 0  # NCCL's buffers, with more than one rank on CUDA

    @property
    def tensor_bytes(self) -> int:
        """Comparable with the allocator's own peak (e.g. `torch.cuda.max_memory_allocated`)."""
        transient = max(
            self.activations, self.optimizer_temporaries, self.gradient_reduce_bucket, self.bucket_rebuild
        )
        return (
            self.parameters + self.gradients + self.optimizer_state + transient + self.data
            + self.autocast_weights
        )  # fmt: skip

    @property
    def total_bytes(self) -> int:
        return self.tensor_bytes + self.overhead_bytes + self.communication_bytes

    @property
    def total_gib(self) -> float:
        return self.total_bytes / 2**30


@dataclass(frozen=True)
class ModelFootprint:
    """What a model costs per worker, measured once; `estimate` prices any micro-batch."""

    state_bytes: int  # parameters and buffers
    trainable_bytes: int  # parameters that get gradients and AdamW state
    trainable_count: int
    activation_bytes_per_row: float  # 0 when they could not be measured
    n_features: int
    precision: str  # the name in tasks/core/models/precision.py the estimate counts: "fp32" or "bf16"

    def estimate(
        self,
        micro_batch: int,
        resident_rows: int = 0,
        framework: str = "pytorch",
        on_accelerator: bool = True,
        world_size: int = 1,
    ) -> MemoryEstimate:
        """Peak memory of one worker/replica training with `micro_batch` rows per step.

        `resident_rows` are the dataset rows kept on the device (this worker's train + val shard
        under the "device" placement, else none);
        `world_size` the data-parallel workers (torch DDP ranks, or TensorFlow replicas)."""
        overhead = 0
        if on_accelerator:
            overhead = CUDA_CONTEXT_BYTES if framework == "pytorch" else TF_RUNTIME_BYTES
        ddp = framework == "pytorch" and world_size > 1
        precision = named(self.precision)
        estimate = MemoryEstimate(
            parameters=self.state_bytes,
            gradients=self.trainable_bytes,
            optimizer_state=2 * self.trainable_bytes,
            # foreach AdamW allocates up to two parameter-sized temporaries in its step.
            optimizer_temporaries=2 * self.trainable_bytes,
            activations=round(self.activation_bytes_per_row * micro_batch),
            data=resident_rows * (self.n_features * FP32 + 8),
            autocast_weights=self.trainable_count * precision.value_bytes if precision.mixed else 0,
            overhead_bytes=overhead,
            gradient_reduce_bucket=min(GRADIENT_REDUCE_BUCKET_BYTES, self.trainable_bytes) if ddp else 0,
            bucket_rebuild=self.trainable_bytes if ddp else 0,
            communication_bytes=NCCL_BYTES if ddp and on_accelerator else 0,
        )
        estimate.overhead_bytes += int(ALLOCATOR_SLACK * estimate.tensor_bytes) if on_accelerator else 0
        return estimate


def ddp_bucket_cap_mb(gradient_bytes: int) -> float:
    """DDP's `bucket_cap_mb` for a model with `gradient_bytes` of gradients (DDP_BUCKETS says why)."""
    return min(max(gradient_bytes / 2**20 / DDP_BUCKETS, DDP_BUCKET_MIN_MIB), DDP_BUCKET_MAX_MIB)
