"""The torch loop's training rows: one epoch order for every placement, and the feeds that hand each
optimizer step's rows to the device from where the planner placed them.

A rank's rows are its part of the split (`tasks.core.training.rank_part.RankPart`): blocks of row groups. The
epoch order is a function of the blocks' sizes, the seed, the epoch and the shuffle buffer alone, so
the shard on the device ("device"), in pinned host memory ("host") and read from the files as the
epoch goes ("stream") train on the same rows in the same order, and so end with the same parameters.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass

import numpy as np
import torch
from torch.profiler import record_function

from tasks.core.training import ranges
from tasks.core.training.devices import family_of
from tasks.core.training.rank_part import RankPart

Rows = tuple[np.ndarray, np.ndarray]  # (features float32, label codes int64)
PREFETCH_STEPS = 2  # batches a background reader keeps ready ahead of the loop
GATHER_ROWS = 65_536  # a window's rows handed over at a time, in training order
# "auto" with no plan: the share of the memory free on this rank's device (host memory for a CPU
# device, shared by the ranks on the machine) that its rows may take; the rest is the model's, the
# optimizer's and the reading's (decoding a row group holds a copy while it is converted).
RESIDENT_SHARE = 0.25


def auto_placement(rows: int, features: int, device: torch.device, ranks_on_machine: int = 1) -> str:
    """Where "auto" keeps a rank's rows when no plan chose for this machine: on the device while
    they take at most RESIDENT_SHARE of what it has free, else streamed from the split's files."""
    needed = rows * (features * 4 + 8)  # float32 features and an int64 label code a row
    budget = RESIDENT_SHARE * free_memory_bytes(device) / max(ranks_on_machine, 1)
    return "device" if needed <= budget else "stream"


def free_memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    import psutil  # here: a GPU machine that reuses the loop may lack it, and needs it only on CPU

    return psutil.virtual_memory().available


@dataclass(frozen=True)
class Window:
    """The rows shuffled together: `pieces` (block index, first row, stop row) laid end to end, and
    `order`, the window's rows in the order they train, as indexes into those pieces."""

    pieces: list[tuple[int, int, int]]
    order: np.ndarray


def epoch_windows(block_rows: list[int], seed: int, epoch: int, buffer_rows: int) -> Iterator[Window]:
    """The epoch's windows, in order: a pure function of its arguments.

    A part of at most `buffer_rows` rows is one window, fully permuted.
    A larger one has its blocks permuted, then cut into windows of `buffer_rows` rows, each permuted.
    """
    generator = torch.Generator().manual_seed(seed * 1_000 + epoch)
    permutation = lambda n: torch.randperm(n, generator=generator).numpy()  # noqa: E731
    total = sum(block_rows)
    if total <= buffer_rows:
        yield Window([(block, 0, rows) for block, rows in enumerate(block_rows)], permutation(total))
        return
    pieces, held = [], 0
    for block in permutation(len(block_rows)).tolist():
        first = 0
        while first < block_rows[block]:
            take = min(block_rows[block] - first, buffer_rows - held)
            pieces.append((block, first, first + take))
            first, held = first + take, held + take
            if held == buffer_rows:
                yield Window(pieces, permutation(held))
                pieces, held = [], 0
    if pieces:
        yield Window(pieces, permutation(held))


def epoch_order(block_rows: list[int], seed: int, epoch: int, buffer_rows: int) -> np.ndarray:
    """The epoch's rows as positions in the part (its blocks laid end to end), in training order."""
    starts = np.cumsum([0, *block_rows])
    windows = [
        np.concatenate([np.arange(starts[b] + first, starts[b] + stop) for b, first, stop in window.pieces])[
            window.order
        ]
        for window in epoch_windows(block_rows, seed, epoch, buffer_rows)
    ]
    return np.concatenate(windows)


class EpochOrders:
    """Each epoch's `epoch_order`, computed on a background thread ahead of its epoch: permuting
    millions of rows on the host takes a tenth of a second, which would otherwise hold up the epoch's
    first step while the device waits. The next epoch's is computed while one trains, and the
    `first` (seed, epoch, buffer_rows), where given, from the start: for the first epoch, while its
    rows are read and placed."""

    def __init__(self, block_rows: list[int], first: tuple[int, int, int] | None = None):
        self.block_rows = block_rows
        self.ahead: tuple[tuple[int, int, int], Future] | None = None
        if first is not None:
            self.start(first)

    def start(self, key: tuple[int, int, int]) -> None:
        """Begin computing the order of `key` (seed, epoch, buffer_rows) on a background thread."""
        self.ahead = (key, in_background(epoch_order, self.block_rows, *key))

    def order(self, seed: int, epoch: int, buffer_rows: int, epochs: int) -> np.ndarray:
        key, ahead = (seed, epoch, buffer_rows), self.ahead
        order = ahead[1].result() if ahead and ahead[0] == key else epoch_order(self.block_rows, *key)
        self.ahead = None
        if epoch + 1 < epochs:
            self.start((seed, epoch + 1, buffer_rows))
        return order


def in_background(function: Callable, *args) -> Future:
    """`function(*args)` on a daemon thread; its result, or its error, in the future returned."""
    future: Future = Future()

    def run() -> None:
        try:
            future.set_result(function(*args))
        except BaseException as error:  # re-raised by `result()` in the caller's thread
            future.set_exception(error)

    threading.Thread(target=run, name="epoch-order", daemon=True).start()
    return future


def streamed_rows(windows: Iterable[Window], read_block: Callable[[int], Rows], skip: int) -> Iterator[Rows]:
    """Each window's rows in training order, read block by block, after the first `skip` rows: a
    window wholly skipped is never read. Holds one window and one block at a time, and hands the
    window over in chunks of `GATHER_ROWS`, so no second copy of the whole window is made."""
    cached: tuple[int, Rows] | None = None
    for window in windows:
        if skip >= len(window.order):
            skip -= len(window.order)
            continue
        pieces = []
        for block, first, stop in window.pieces:
            if cached is None or cached[0] != block:
                cached = (block, read_block(block))
            pieces.append(tuple(column[first:stop] for column in cached[1]))
        held = tuple(np.concatenate(column) for column in zip(*pieces, strict=True))
        order, skip = window.order[skip:], 0
        for start in range(0, len(order), GATHER_ROWS):
            rows = order[start : start + GATHER_ROWS]
            yield tuple(column[rows] for column in held)


def rebatched(parts: Iterable[Rows], rows_per_batch: int, batches: int | None = None) -> Iterator[Rows]:
    """`parts` laid end to end, cut into batches of `rows_per_batch` rows (the last may be short
    where `batches` is None; else only `batches` full ones). A batch within one part is a view of it;
    only a batch that straddles parts is copied."""
    filling: list[Rows] = []
    filled, made = 0, 0
    for x, y in parts:
        start = 0
        while start < len(y):
            take = min(rows_per_batch - filled, len(y) - start)
            filling.append((x[start : start + take], y[start : start + take]))
            filled, start = filled + take, start + take
            if filled == rows_per_batch:
                yield joined(filling)
                filling, filled, made = [], 0, made + 1
                if made == batches:
                    return
    if filled and batches is None:
        yield joined(filling)


def joined(pieces: list[Rows]) -> Rows:
    if len(pieces) == 1:
        return pieces[0]
    return tuple(np.concatenate(column) for column in zip(*pieces, strict=True))


def prefetched(batches: Iterator, device: torch.device) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """`batches` (numpy or CPU tensors) made by a background thread while the loop trains, pinned
    where the device is a GPU, and copied to the device a step ahead (`DeviceFamily.copied_ahead`)."""
    ready: queue.Queue = queue.Queue(PREFETCH_STEPS)
    stop, done = threading.Event(), object()

    def hand_over(item) -> None:
        while not stop.is_set():
            try:
                return ready.put(item, timeout=0.1)
            except queue.Full:
                continue

    def produce() -> None:
        try:
            for batch in batches:
                hand_over(tuple(pinned(torch.as_tensor(column), device) for column in batch))
                if stop.is_set():
                    return
            hand_over(done)
        except BaseException as error:  # re-raised in the loop's thread
            hand_over(error)

    def handed_over() -> Iterator[tuple[torch.Tensor, ...]]:
        while (item := ready.get()) is not done:
            if isinstance(item, BaseException):
                raise item
            yield item

    reader = threading.Thread(target=produce, name="training-rows", daemon=True)
    reader.start()
    try:
        yield from family_of(device).copied_ahead(handed_over(), device)
    finally:
        stop.set()
        reader.join()


def pinned(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    return tensor.pin_memory() if family_of(device).pins_host_memory else tensor


class TrainingRows:
    """This rank's training and validation rows, placed "device", "host" or "stream"; `epoch` gives
    each optimizer step's (x, y) on the device, `validation` the validation rows in batches."""

    def __init__(
        self,
        placement: str,
        train: RankPart,
        val: RankPart,
        columns: tuple[list[str], str],
        device,
        first_order: tuple[int, int, int] | None = None,
    ):
        """`first_order`: the (seed, epoch, buffer_rows) of the first epoch to train, whose order
        is then computed while the rows are read (not for streamed rows, which need none)."""
        self.placement, self.train, self.val, self.columns, self.device = (
            placement,
            train,
            val,
            columns,
            device,
        )
        self.block_rows = [block.rows for block in train.blocks]
        self.orders = EpochOrders(self.block_rows, first_order if placement != "stream" else None)
        self.held: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        if placement != "stream":
            # Not pinned as a whole: each gathered batch is a new tensor, which `prefetched` pins.
            where = device if placement == "device" else torch.device("cpu")
            for name, part in (("train", train), ("val", val)):
                x, y = part.read(part.blocks, *columns)
                self.held[name] = (torch.from_numpy(x).to(where), torch.from_numpy(y).to(where))

    def read_block(self, part: RankPart, index: int) -> Rows:
        return part.read_block(part.blocks[index], *self.columns)

    def epoch(self, config, epoch: int, first_step: int, steps: int, per_step: int) -> Iterator:
        """The steps `first_step` to `steps` of `epoch`, `per_step` rows each."""
        args = (self.block_rows, config.seed, epoch, config.shuffle_buffer_rows)
        if self.placement == "stream":
            windows = epoch_windows(*args)
            rows = streamed_rows(
                windows, lambda index: self.read_block(self.train, index), first_step * per_step
            )
            return prefetched(rebatched(rows, per_step, steps - first_step), self.device)
        x, y = self.held["train"]
        with record_function(ranges.EPOCH_ORDER):
            order = self.orders.order(config.seed, epoch, config.shuffle_buffer_rows, config.epochs)
            order = torch.from_numpy(order[first_step * per_step : steps * per_step]).to(x.device)
        gathered = ((x[rows], y[rows]) for rows in order.split(per_step))
        return gathered if self.placement == "device" else prefetched(gathered, self.device)

    def validation(self, batch: int) -> Iterator:
        if self.placement == "stream":
            blocks = (self.read_block(self.val, index) for index in range(len(self.val.blocks)))
            return prefetched(rebatched(blocks, batch), self.device)
        x, y = self.held["val"]
        batches = zip(x.split(batch), y.split(batch), strict=True)
        return batches if self.placement == "device" else prefetched(batches, self.device)
