"""A subscription's in-flight pushes: offset -> pushes so far, in increasing offset order.

In the usual case the pushes in flight are one run of offsets ``lo..hi-1``, each
pushed once, acked from the low end: :class:`InFlight` then holds just the two
ends, so pushing a batch and acking a prefix cost O(1) instead of a dict entry per
message. Anything else (a re-push, an ack inside the run, a gap) turns it into a
plain dict until it is empty again.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator, Mapping, MutableMapping
from itertools import repeat


class InFlight(MutableMapping[int, int]):
    """Offsets pushed to the attached session and not acked -> pushes used so far.

    Iteration is in increasing offset order: first pushes are added in offset
    order, and a re-push updates its entry in place.
    """

    __slots__ = ("_hi", "_lo", "_map")

    def __init__(self, items: Mapping[int, int] | None = None) -> None:
        self._lo = self._hi = 0          # the run lo..hi-1, each pushed once ...
        self._map: dict[int, int] | None = None  # ... unless this dict holds them instead
        if items:
            self._map = dict(sorted(items.items()))

    def _as_dict(self) -> dict[int, int]:
        if self._map is None:
            self._map = dict.fromkeys(range(self._lo, self._hi), 1)
        return self._map

    # -- the mapping ------------------------------------------------------------------

    def __len__(self) -> int:
        return self._hi - self._lo if self._map is None else len(self._map)

    def __contains__(self, offset: object) -> bool:
        if self._map is None:
            return type(offset) is int and self._lo <= offset < self._hi
        return offset in self._map

    def __getitem__(self, offset: int) -> int:
        if self._map is None:
            if type(offset) is int and self._lo <= offset < self._hi:
                return 1
            raise KeyError(offset)
        return self._map[offset]

    def get(self, offset: int, default: int | None = None) -> int | None:  # type: ignore[override]
        if self._map is None:
            return 1 if type(offset) is int and self._lo <= offset < self._hi else default
        return self._map.get(offset, default)

    def __setitem__(self, offset: int, pushes: int) -> None:
        if self._map is None and pushes == 1 and type(offset) is int:
            if self._lo == self._hi:
                self._lo, self._hi = offset, offset + 1
                return
            if offset == self._hi:
                self._hi += 1
                return
        self._as_dict()[offset] = pushes

    def __delitem__(self, offset: int) -> None:
        if self._map is None:
            if offset not in self:
                raise KeyError(offset)
            if offset == self._lo:
                self._lo += 1
                return
            if offset == self._hi - 1:
                self._hi -= 1
                return
        del self._as_dict()[offset]
        if not self._map:
            self.clear()

    def pop(self, offset: int, default: int | None = None) -> int | None:  # type: ignore[override]
        """Remove ``offset``; its pushes, or ``default`` if it was not in flight."""
        flight = self._map
        if flight is None:
            if type(offset) is not int or not self._lo <= offset < self._hi:
                return default
            if offset == self._lo:  # acks in order: the run shrinks from its low end
                self._lo += 1
                return 1
            flight = self._as_dict()
        pushes = flight.pop(offset, default)
        if not flight:
            self.clear()
        return pushes

    def __iter__(self) -> Iterator[int]:
        return iter(range(self._lo, self._hi) if self._map is None else self._map)

    def clear(self) -> None:
        self._lo = self._hi = 0
        self._map = None

    def __repr__(self) -> str:
        return f"InFlight({dict(self.items())!r})"

    # -- in bulk (the hot path) -------------------------------------------------------

    def first(self) -> int:
        """The lowest offset in flight (there must be one)."""
        return self._lo if self._map is None else next(iter(self._map))

    def last(self) -> int:
        """The highest offset in flight (there must be one)."""
        return self._hi - 1 if self._map is None else next(reversed(self._map))

    def push_first(self, offsets: Iterable[int]) -> None:
        """First pushes (one each) of ``offsets``, increasing and above every offset in
        flight; a ``range`` that continues the run is two integers' work."""
        if self._map is None and type(offsets) is range and offsets.step == 1 and offsets:
            if self._lo == self._hi:
                self._lo, self._hi = offsets.start, offsets.stop
                return
            if offsets.start == self._hi:
                self._hi = offsets.stop
                return
        self._as_dict().update(dict.fromkeys(offsets, 1))

    def drop_through(self, through: int) -> None:
        """Remove every offset up to ``through``, when they are exactly the offsets
        ``first()..through`` (a prefix with no gaps)."""
        if self._map is None:
            self._lo = min(through + 1, self._hi)
            return
        deque(map(self._map.pop, range(next(iter(self._map)), through + 1), repeat(None)), 0)
        if not self._map:
            self.clear()
