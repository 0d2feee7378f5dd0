"""Training state on disk: everything needed to continue a run exactly where it stopped.

The state is plain tensors and primitives, written atomically and loaded with
`weights_only=True`. Where it is kept between attempts (Flyte's task checkpoint) is up to the
caller, through `on_save`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path

import torch

log = logging.getLogger(__name__)
STATE_FILE = "training_state.pt"


class TrainingCheckpoint:
    def __init__(self, directory: str, every_steps: int = 0, on_save: Callable[[str], None] | None = None):
        self.directory = Path(directory)
        self.every_steps = every_steps
        self.on_save = on_save
        self.directory.mkdir(parents=True, exist_ok=True)

    @property
    def path(self) -> Path:
        return self.directory / STATE_FILE

    def load(self) -> dict | None:
        if not self.path.exists():
            return None
        state = torch.load(self.path, map_location="cpu", weights_only=True)
        log.info("resuming from checkpoint: epoch %d, step %d", state["epoch"] + 1, state["step"])
        return state

    def save(self, state: dict) -> None:
        partial = self.path.with_suffix(".partial")
        torch.save(state, partial)
        os.replace(partial, self.path)  # a kill mid-write leaves the previous checkpoint intact
        if self.on_save:
            self.on_save(str(self.directory))

    def due(self, steps_done_in_epoch: int) -> bool:
        return self.every_steps > 0 and steps_done_in_epoch % self.every_steps == 0
