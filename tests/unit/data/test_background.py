"""background.py: reading ahead, working on a few batches at once and writing behind, in threads. Items
and results keep their order, an error reaches the caller in that order with its type and message, and
a caller that stops early or finishes leaves no thread behind. Waits are bounded: a bug fails a test
rather than hanging it."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from tasks.core.data.background import WriteBehind, ordered_map, read_ahead

WAIT = 10.0  # seconds a thread waits for another before the test fails: never reached when it works


class Unreadable(Exception):
    pass


def threads_named(prefix: str) -> list[str]:
    return [thread.name for thread in threading.enumerate() if thread.name.startswith(prefix)]


def returns(call: Callable[[], None]) -> bool:
    """Whether `call`, made in a thread, returns within WAIT seconds (a hung one is left behind)."""
    thread = threading.Thread(target=call, name="test-caller", daemon=True)
    thread.start()
    thread.join(WAIT)
    return not thread.is_alive()


def endless(produced: list[int]) -> Iterator[int]:
    """0, 1, 2, ... for ever, each noted in `produced` as it is made."""
    for item in itertools.count():
        produced.append(item)
        yield item


# --- read_ahead -----------------------------------------------------------------------------------


@pytest.mark.parametrize("depth", [1, 2, 5])
def test_read_ahead_yields_every_item_in_order(depth):
    assert list(read_ahead(iter(range(50)), depth)) == list(range(50))
    assert list(read_ahead(iter([]), depth)) == []
    assert not threads_named("read-ahead")


@pytest.mark.parametrize("failing", [0, 1, 7])
def test_an_error_making_an_item_reaches_the_caller_after_the_items_before_it(failing):
    def items() -> Iterator[int]:
        yield from range(failing)
        raise Unreadable(f"item {failing} is unreadable")

    got = []
    with pytest.raises(Unreadable, match=f"^item {failing} is unreadable$"):
        for item in read_ahead(items(), depth=2):
            got.append(item)
    assert got == list(range(failing))
    assert not threads_named("read-ahead")


def stop_by_breaking(items: Iterator[int], taken: list[int]) -> None:
    for item in items:
        taken.append(item)
        if len(taken) == 3:
            break


def stop_by_closing(items: Iterator[int], taken: list[int]) -> None:
    taken.extend(next(items) for _ in range(3))
    items.close()


@pytest.mark.parametrize("stop", [stop_by_breaking, stop_by_closing], ids=["break", "close"])
@pytest.mark.parametrize("depth", [1, 2])
def test_a_caller_that_stops_early_ends_the_reading_thread(stop, depth):
    produced, taken = [], []
    assert returns(lambda: stop(read_ahead(endless(produced), depth), taken)), "stopping early hung"
    assert taken == [0, 1, 2]
    assert not threads_named("read-ahead")
    # The thread held `depth` items in the queue and one more waiting for room, and may have made one
    # before it saw the caller had stopped: no more.
    assert len(produced) <= len(taken) + depth + 2


# --- ordered_map ------------------------------------------------------------------------------------


def test_ordered_map_gives_results_in_the_items_order_when_later_ones_finish_first():
    """Each even item waits until the odd one after it is done: the work finishes out of order."""
    done = {item: threading.Event() for item in range(8)}
    finished = []

    def work(item: int) -> str:
        if item % 2 == 0:
            assert done[item + 1].wait(WAIT), f"item {item + 1} did not run beside item {item}"
        finished.append(item)
        done[item].set()
        return f"result {item}"

    results = list(ordered_map(work, iter(range(8)), workers=2))
    assert results == [f"result {item}" for item in range(8)]
    assert finished != sorted(finished)  # the forced order: 1 before 0, 3 before 2, ...
    assert not threads_named("batch-work")


def test_ordered_map_raises_the_first_failing_items_error_in_order():
    """Items 2 and 3 fail, 3 first: the caller gets results 0 and 1, then item 2's error."""
    failed = []
    item_3_failed = threading.Event()

    def work(item: int) -> int:
        if item == 2:
            assert item_3_failed.wait(WAIT), "item 3 did not run beside item 2"
        if item in (2, 3):
            failed.append(item)
            item_3_failed.set()
            raise Unreadable(f"item {item} failed")
        return item

    got = []
    with pytest.raises(Unreadable, match="^item 2 failed$"):
        for result in ordered_map(work, iter(range(6)), workers=2):
            got.append(result)
    assert got == [0, 1]
    assert failed == [3, 2]
    assert not threads_named("batch-work")


def test_ordered_map_stopped_early_ends_its_threads_and_takes_few_items():
    produced = []
    results = ordered_map(lambda item: item * 2, endless(produced), workers=2)
    assert [next(results) for _ in range(3)] == [0, 2, 4]
    results.close()
    assert not threads_named("batch-work")
    assert len(produced) <= 3 + 2


# --- WriteBehind ------------------------------------------------------------------------------------


def test_each_lanes_writes_are_done_in_the_order_given():
    """The earlier writes take longer: a lane that wrote two at once would write them out of order."""
    written: dict[str, list[int]] = {"train": [], "test": []}
    behind = WriteBehind(list(written))

    def write(lane: str, item: int) -> None:
        time.sleep(0.001 * (8 - item))
        written[lane].append(item)

    for item in range(8):
        for lane in written:
            behind.submit(lane, lambda lane=lane, item=item: write(lane, item))
    behind.finish()
    assert written == {"train": list(range(8)), "test": list(range(8))}
    assert not threads_named("write-")


def test_lanes_are_written_side_by_side():
    """Lane a's write waits for lane b's, submitted after it: lanes written one after another would fail."""
    b_wrote = threading.Event()
    written = []

    def write_a() -> None:
        assert b_wrote.wait(WAIT), "lane b was not written while lane a's write waited"
        written.append("a")

    def write_b() -> None:
        written.append("b")
        b_wrote.set()

    behind = WriteBehind(["a", "b"])
    behind.submit("a", write_a)
    behind.submit("b", write_b)
    behind.finish()
    assert written == ["b", "a"]
    assert not threads_named("write-")


def fail() -> None:
    raise Unreadable("the disk is full")


def test_an_error_writing_is_raised_at_finish():
    written = []
    behind = WriteBehind(["a", "b"])
    behind.submit("a", fail)
    behind.submit("b", lambda: written.append("b"))
    with pytest.raises(Unreadable, match="^the disk is full$"):
        behind.finish()
    assert not threads_named("write-")


def test_an_error_writing_is_raised_at_a_later_submit_on_its_lane():
    written = []
    behind = WriteBehind(["a", "b"])
    behind.submit("a", fail)
    behind.submit("b", lambda: written.append("b"))
    raised = None
    for item in range(3):  # at most two writes wait in a lane
        try:
            behind.submit("a", lambda item=item: written.append(item))
        except Unreadable as err:
            raised = err
            break
    behind.finish()
    assert isinstance(raised, Unreadable) and str(raised) == "the disk is full"
    assert "b" in written
    assert not threads_named("write-")


def test_finish_with_nothing_written_leaves_no_thread():
    behind = WriteBehind(["train", "val", "test"])
    behind.finish()
    assert not threads_named("write-")
