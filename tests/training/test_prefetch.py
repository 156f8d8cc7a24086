"""`order.prefetched`: the Trainer's read-ahead on CUDA gives the same items in the same order, raises a
reading error at the item it stopped at, and stops its thread when training stops early."""

from __future__ import annotations

import threading
import time

import pytest

from bertforge.training.order import prefetched


def threads() -> int:
    return sum(thread.name == "bertforge-prefetch" for thread in threading.enumerate())


def test_the_same_items_in_the_same_order():
    assert list(prefetched(iter(range(50)), depth=3)) == list(range(50))
    assert list(prefetched(iter([]))) == []
    assert threads() == 0


def test_a_reading_error_is_raised_at_the_item_it_stopped_at():
    def items():
        yield from (0, 1)
        raise OSError("shard 3 is truncated")

    got = []
    with pytest.raises(OSError, match="shard 3 is truncated"):
        for item in prefetched(items()):
            got.append(item)
    assert got == [0, 1] and threads() == 0


def test_it_reads_ahead_at_most_depth_and_stops_when_closed():
    read = []

    def items():
        for index in range(1000):
            read.append(index)
            yield index

    stream = prefetched(items(), depth=2)
    assert next(stream) == 0
    time.sleep(0.3)  # the thread fills the queue, then waits
    assert len(read) <= 1 + 2 + 1  # the item handed out, the queue, the one waiting to enter it
    stream.close()
    assert threads() == 0 and len(read) < 10
    with pytest.raises(ValueError, match="depth must be >= 1"):
        next(prefetched(iter([1]), depth=0))
