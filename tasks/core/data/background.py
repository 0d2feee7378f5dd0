"""Reading, working and writing side by side: pyarrow decodes and encodes parquet, and numpy and pyarrow
compute on whole arrays, without holding Python's lock. So a thread reads the next batches
(`read_ahead`), `ordered_map` works on a few at once, and a thread writes the last (`WriteBehind`). Each
holds a batch or two at most: memory stays bounded by a batch, and results come in the rows' order."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from queue import Empty, Queue
from typing import TypeVar

Item = TypeVar("Item")
Result = TypeVar("Result")
WORKERS = 2  # batches worked on at once: a preprocessing pod has two cores or more
WAIT_SECONDS = 0.1  # how often a waiting caller looks whether the reading thread has ended
END = object()


def read_ahead(items: Iterator[Item], depth: int = 2) -> Iterator[Item]:
    """`items` in order, the next `depth` of them produced in a thread while the caller works on the
    one before. An error producing them is raised here, as it was raised there; a caller that stops
    early stops the thread too."""
    queue: Queue = Queue(maxsize=depth)
    stopped = threading.Event()

    def produce() -> None:
        try:
            for item in items:
                queue.put((item, None))
                if stopped.is_set():
                    break
            queue.put((END, None))
        except BaseException as err:  # handed to the caller, which raises it
            queue.put((END, err))

    def taken() -> tuple[object, BaseException | None]:
        while True:
            try:
                return queue.get(timeout=WAIT_SECONDS)
            except Empty:
                if not thread.is_alive():
                    raise RuntimeError("the read-ahead thread ended without a word") from None

    thread = threading.Thread(target=produce, name="read-ahead", daemon=True)
    thread.start()
    ended = False
    try:
        while True:
            item, error = taken()
            ended = item is END
            if error is not None:
                raise error
            if ended:
                return
            yield item
    finally:
        stopped.set()
        while not ended:  # take what it still offers: it ends after the item it is reading
            ended = taken()[0] is END


def ordered_map(
    work: Callable[[Item], Result], items: Iterator[Item], workers: int = WORKERS
) -> Iterator[Result]:
    """`work` of each of `items`, in their order, `workers` of them at a time in threads; an error is
    raised in that order too, once the items before it are done."""
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="batch-work") as pool:
        pending: list[Future] = []
        try:
            for item in items:
                if len(pending) >= workers:
                    yield pending.pop(0).result()
                pending.append(pool.submit(work, item))
            while pending:
                yield pending.pop(0).result()
        finally:
            for future in pending:
                future.cancel()


class WriteBehind:
    """Writes done in threads, one a lane (a file), each lane's in the order given, while the caller
    prepares the next: at most two writes wait in a lane, and an error writing is raised by a later
    `submit` to the lane (once the write is no longer among the two last) or by `finish`."""

    def __init__(self, lanes: list[str]) -> None:
        self.pools = {
            lane: ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"write-{lane}") for lane in lanes
        }
        self.pending: dict[str, list[Future]] = {lane: [] for lane in lanes}

    def submit(self, lane: str, write: Callable[[], None]) -> None:
        pending = self.pending[lane]
        while len(pending) > 1:
            pending.pop(0).result()
        pending.append(self.pools[lane].submit(write))

    def finish(self) -> None:
        """Every write done (the first error raised), and the threads ended."""
        try:
            for pending in self.pending.values():
                for future in pending:
                    future.result()
        finally:
            for lane, pool in self.pools.items():
                self.pending[lane].clear()
                pool.shutdown(wait=True, cancel_futures=True)
