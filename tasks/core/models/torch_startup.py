"""Start-up time patches, all in one place, each applied only to the releases it was checked against.

None of them changes what a run computes; each removes seconds of CPU before the first step:
- torch elastic names its rendezvous events with a stack walk (`rendezvous_events_named_without_stack_walks`);
- torch's TensorBoard writer imports all of TensorFlow where it is installed (`tensorboard_without_tensorflow`);
- a `TorchDispatchMode` imports torch._dynamo on its first op (`EagerDispatchMode`).
Under another torch or TensorBoard release they do nothing, and tests/unit/models/test_torch_startup.py fails in
`make test` until the release is checked and added below.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import sys
import types

from torch.utils._python_dispatch import TorchDispatchMode

CHECKED_TORCH = ("2.13",)
CHECKED_TENSORBOARD = ("2.20",)


def release(package: str) -> str:
    """`major.minor` of the installed `package`."""
    return ".".join(importlib.metadata.version(package).split(".")[:2])


@functools.cache  # read where a patch applies, once per process: the installed releases do not change
def checked(package: str, releases: tuple[str, ...]) -> bool:
    try:
        return release(package) in releases
    except importlib.metadata.PackageNotFoundError:
        return False


@contextlib.contextmanager
def rendezvous_events_named_without_stack_walks():
    """torch elastic's rendezvous names each event it records after the method that recorded it, found
    by `get_method_name` with `inspect.stack()` (torch/distributed/elastic/rendezvous/
    dynamic_rendezvous.py): about 0.3 s of CPU a call in a launcher with flytekit, torch and the tasks
    loaded, and a launch records about nine events. The stand-in reads the same frame's name directly."""
    if not checked("torch", CHECKED_TORCH):
        yield
        return
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous

    name_by_stack_walk = dynamic_rendezvous.get_method_name

    def calling_method_name(depth: int = 2) -> str:
        try:
            return sys._getframe(depth).f_code.co_name
        except ValueError:  # the stack is not that deep
            return "no_method_name"

    dynamic_rendezvous.get_method_name = calling_method_name
    try:
        yield
    finally:
        dynamic_rendezvous.get_method_name = name_by_stack_walk


def tensorboard_without_tensorflow() -> None:
    """Make TensorBoard's event writer use its own TensorFlow-free file I/O (its `notf` switch).

    Otherwise the first event file imports TensorFlow where it is installed: seconds per rank before
    training starts. Process-wide and final (TensorFlow's own `tf.summary` stops working), so only DDP
    worker processes, which never run TensorFlow, call it.
    """
    if "tensorflow" not in sys.modules and checked("tensorboard", CHECKED_TENSORBOARD):
        sys.modules.setdefault("tensorboard.compat.notf", types.ModuleType("tensorboard.compat.notf"))


class EagerDispatchMode(TorchDispatchMode):
    """A dispatch mode for eager ops only: torch would wrap `__torch_dispatch__` to keep torch.compile
    out of it, and that wrapper imports torch._dynamo (over a second of CPU) on its first op. torch
    documents this override on `TorchDispatchMode._should_skip_dynamo`."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        if not checked("torch", CHECKED_TORCH):
            return super()._should_skip_dynamo()
        return False
