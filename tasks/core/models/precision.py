"""The precisions a run trains in, and how each framework names them: one table for both loops,
the memory probe and the planner. Imports neither torch nor TensorFlow.

The user asks for one of `tasks.core.training.config.PRECISIONS` ("auto" or a name of the table); each loop
resolves that, by the device it runs on, to an entry of the table.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Precision:
    name: str  # as `TrainConfig.precision` names it
    torch_autocast: str | None  # the torch dtype autocast computes in; None: no autocast (float32)
    keras_policy: str  # the Keras dtype policy
    value_bytes: int  # of an activation or a weight copy computed in it

    @property
    def mixed(self) -> bool:
        return self.torch_autocast is not None


BF16 = Precision("bf16", "bfloat16", "mixed_bfloat16", 2)
FP16 = Precision("fp16", "float16", "mixed_float16", 2)
FP32 = Precision("fp32", None, "float32", 4)
TABLE = {precision.name: precision for precision in (BF16, FP16, FP32)}


def named(name: str) -> Precision:
    if name not in TABLE:
        raise ValueError(f"precision {name!r} is not one of {', '.join(TABLE)}")
    return TABLE[name]


def for_torch(asked: str, accelerator: str | None, native_bf16: Callable[[], bool]) -> Precision:
    """What the torch loop trains in when `asked`: float32 for "fp32" or off an accelerator
    (`accelerator` None, e.g. CPU); else fp16 when asked, bf16 where `accelerator` computes it
    natively, and fp16 with the gradient scaler where it only emulates bf16 (pre-Ampere GPUs, where
    emulated bf16 is slower). Asking for bf16 there is refused, naming the `accelerator`."""
    if asked == "fp32" or accelerator is None:
        return FP32
    if asked == "fp16":
        return FP16
    native = native_bf16()
    if asked == "bf16" and not native:
        raise ValueError(f"precision='bf16' asked for but {accelerator} has no native bf16 support")
    return BF16 if native else FP16


def for_keras(asked: str, strategy_kind: str, gpu_count: int) -> Precision:
    """What the Keras loop trains in: bf16 on a TPU, fp16 on GPUs (bf16 if asked), float32 on CPU
    or when "fp32" is asked."""
    if asked == "fp32":
        return FP32
    if strategy_kind == "tpu":
        return BF16
    if gpu_count == 0:
        return FP32
    return BF16 if asked == "bf16" else FP16


def for_planning(asked: str) -> Precision:
    """The precision the memory estimate counts for the one the user asked for (a `PRECISIONS` name):
    two bytes a value under any mixed precision, which is what every choice but fp32 may give."""
    return FP32 if asked == "fp32" else BF16
