"""What a shared subscription's member holds, a batch at a time: its in-flight offsets,
the key of each keyed one and how many of each key (G10's pins, :mod:`flux.shard.sharing`).

Lives here: taking keys on at a push and letting offsets go at an ack, over a
member's own maps. Which member a key is pinned to, and what a released key's
waiting messages do next, are :mod:`flux.shard.sharing`'s.

Each runs in C (:data:`fast`, ``flux/shard/_held_keys.c``, built with Flux where a
C compiler is) or, without it, as the Python here, which does exactly the same;
``FLUX_PURE_PYTHON=1`` in the environment (or ``fast = None``) takes the Python, and
the tests run both against each other.
"""

from __future__ import annotations

import os
from collections import _count_elements as count_elements  # type: ignore[attr-defined]
from collections import deque
from collections.abc import Sequence
from itertools import repeat
from types import ModuleType
from typing import cast

fast: ModuleType | None  # the C functions; None: the Python ones below
try:
    from flux.shard import _held_keys as fast
except ImportError:  # pragma: no cover (built with Flux where a C compiler is)
    fast = None
if os.environ.get("FLUX_PURE_PYTHON") == "1":
    fast = None


def hold_keys(key_of: dict[int, str], keys: dict[str, int], offsets: Sequence[int],
              key_at: dict[int, str]) -> None:
    """Each of ``offsets`` that ``key_at`` gives a key and ``key_of`` does not hold yet is
    held under it (``key_of``), and its key counted once more (``keys``)."""
    if fast is not None:
        fast.hold_keys(key_of, keys, offsets, key_at)
        return
    held = list(map(key_at.get, offsets))
    if None not in held and key_of.keys().isdisjoint(offsets) \
            and len(set(offsets)) == len(offsets):
        # the usual case: each offset new, keyed: counted at C speed (Counter's own
        # helper: one more for each key, on a plain dict)
        new_keys = cast(list[str], held)
        key_of.update(zip(offsets, new_keys, strict=True))
        count_elements(keys, new_keys)
        return
    for offset, key in zip(offsets, held, strict=True):
        if key is not None and offset not in key_of:
            key_of[offset] = key
            keys[key] = keys.get(key, 0) + 1


def let_go(in_flight: dict[int, int], key_of: dict[int, str], keys: dict[str, int],
           offsets: Sequence[int]) -> list[str] | None:
    """Unless ``offsets`` are distinct ints all in ``in_flight`` (None, nothing changed):
    each leaves ``in_flight`` and ``key_of`` and its key is counted once less; returns
    the keys that have none held now (taken out of ``keys``), in the order they emptied."""
    if fast is not None:
        released: list[str] | None = fast.let_go(in_flight, key_of, keys, offsets)
        return released
    if not offsets or set(map(type, offsets)) != {int} \
            or not all(map(in_flight.__contains__, offsets)) \
            or len(set(offsets)) != len(offsets):
        return None
    deque(map(in_flight.__delitem__, offsets), 0)
    released = []
    if key_of:
        for key in map(key_of.pop, offsets, repeat(None)):
            if key is not None:
                left = keys[key] - 1
                if left:
                    keys[key] = left
                else:
                    del keys[key]
                    released.append(key)
    return released
