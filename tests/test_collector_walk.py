"""What a shard holds per message is not walked by the garbage collector's full
collections (flux.shard.columns): a soaked shard's held runs and dedup marks once made
every full collection follow about a million references, 25-75 ms on its loop."""

from __future__ import annotations

import gc
from collections import deque
from types import BuiltinFunctionType, FunctionType, ModuleType

from test_core_support import Shard

from flux.shard.columns import column, untracked, walked
from flux.shard.packed_ids import PackedIds

# shared with the whole process, not what the shard holds: not followed
_SHARED = (type, ModuleType, FunctionType, BuiltinFunctionType)


def walked_references(root: object) -> int:
    """The references a full collection follows from the objects it tracks among those
    reachable from ``root`` (an untracked container is looked into, not counted)."""
    seen: set[int] = set()
    stack = [root]
    total = 0
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        refs = gc.get_referents(obj)
        if gc.is_tracked(obj):
            total += len(refs)
        stack.extend(r for r in refs if not isinstance(r, _SHARED))
    return total


def test_held_messages_and_remembered_ids_add_next_to_nothing_a_collection_walks() -> None:
    """1,500 runs of 16 messages held (ttl 600 s) and their 24,000 ids remembered (a
    compact dedup window), half of them acked: the collector follows fewer references
    from the whole shard than there are runs (it followed about 9 a run: each run's
    entry in every column of the log and of the dedup window)."""
    shard = Shard({"message.ttl": 600.0, "message.dedup_window": 120.0})
    publisher, subscriber = shard.connect(), shard.connect()
    subscriber.subscribe(1)
    runs = 1500
    for run in range(runs):
        publisher.publish(*(f"m-{run}-{i:02d}" for i in range(16)))
        delivered = subscriber.deliveries(1)
        if delivered and run % 2:
            subscriber.ack(1, through=delivered[-1][0])
        shard.after(0.01)
    stats = shard.topic_stats()
    assert stats["held"] == stats["dedup_ids"] == runs * 16
    gc.collect()  # (tuples of ids are untracked at their first collection)
    assert walked_references(shard.core) < runs


def test_columns_stay_untracked_whatever_is_done_to_them() -> None:
    values = column()
    values.append((1, "a"))
    values.extend([b"x", None, 2.5])
    values[:] = [1, 2, 3]
    del values[:1]
    values += [{"header": "value"}]
    values.clear()
    gc.collect()
    runs = untracked(deque[int]())
    runs.extend(range(10))
    runs.popleft()
    assert not walked(values) and not walked(runs)


def test_ids_kept_packed_are_not_walked() -> None:
    ids = PackedIds(b"\x92\xa1a\xa1b", 2)
    assert not walked(ids)
    assert list(ids) == ["a", "b"] and not walked(ids)
