"""Columns the garbage collector does not walk: a held run's values, one list slot each.

A topic's log and its dedup window keep one entry per stored run (a chunk, a mark) in
flat lists beside each other: first offsets, store times, ids, packed payloads and so
on, tens of thousands of entries a topic at a high rate. Every full collection walked
each such list end to end, touching every entry's object (a payload's bytes, an id's
string, a boxed int) though none of them can be part of a reference cycle: in a soaked
shard 85 % of the 0.7-1 million references a collection followed, and about half of
its 13-22 ms of CPU, all of it on the loop.

:func:`column` makes a plain list that the collector does not track (:func:`untracked`
does it to any new list, deque or slotted object). That is safe for a container that
only its owner refers to and that holds only values that lead nowhere back to it
(numbers, bytes, strings, tuples of those, a run's :class:`~flux.message_meta.Meta`):
no cycle can pass through it, so the collector has nothing to find there, and
reference counting frees what it held as before. A tracked object it holds (a tuple
not examined yet) counts as referred to from outside while it is held, which it is,
and is collected as usual once let go. Where the interpreter offers no way to untrack
(not CPython), the containers stay tracked: slower collections, the same behaviour.
"""

from __future__ import annotations

import ctypes
import gc
from collections.abc import Callable
from typing import Any, TypeVar

C = TypeVar("C")


def _untracker() -> Callable[[object], None] | None:
    api = getattr(ctypes, "pythonapi", None)
    untrack = getattr(api, "PyObject_GC_UnTrack", None)
    if untrack is None:  # pragma: no cover (CPython has it)
        return None
    untrack.argtypes = [ctypes.py_object]
    untrack.restype = None
    return untrack  # type: ignore[no-any-return]


_untrack = _untracker()


def untracked(values: C) -> C:
    """``values`` (a new, empty list or deque, or a new object of a class with slots),
    no longer tracked by the garbage collector (see the module's docstring for what it
    may hold). Its own operations never track it again."""
    if _untrack is not None:
        _untrack(values)
    return values


def column() -> list[Any]:
    """A new empty list the garbage collector does not track."""
    return untracked([])


def walked(values: object) -> bool:
    """Whether the garbage collector walks ``values`` (what the tests check)."""
    return gc.is_tracked(values)
