"""A cheaper way for torch elastic to name its rendezvous events during a launch.

Kept apart from tasks/core/launch.py, which the task definitions of every image import (through
tasks/hardware.py), so that the launch planning imports no torch.
"""

from __future__ import annotations

import contextlib
import sys


@contextlib.contextmanager
def rendezvous_events_named_without_stack_walks():
    """torch elastic's rendezvous names each event it records after the method that recorded it, found
    by `get_method_name` with `inspect.stack()` (torch/distributed/elastic/rendezvous/
    dynamic_rendezvous.py). That reads the source lines of every frame on the stack and looks each
    frame's module up among all the loaded ones: about 0.3 s of CPU a call in a launcher that has
    flytekit, torch and the tasks loaded, and a launch records about nine events. The stand-in reads
    the same frame's name directly. The handlers call it by its module-level name;
    tests/test_launch.py pins that and the names it gives."""
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
