"""Message ids kept as one packed MessagePack array until they are first wanted.

A str per id costs some 80 bytes; most ids of a long disk log (recovered, or whose
payloads were evicted) are held only for deliveries and FETCH that may never come.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import overload

import msgpack

from flux.shard.columns import untracked


class PackedIds(Sequence[str]):
    """Ids kept as their packed MessagePack array until first wanted: a PUBLISH record's
    (recovery: building a str per id was most of what reading the log cost) or an
    evicted chunk's. The bytes were checked or packed from str when it was made, so
    unpacking them later cannot fail."""

    __slots__ = ("_count", "_ids", "_packed")

    def __init__(self, packed: bytes, count: int) -> None:
        self._packed = packed
        self._count = count
        self._ids: tuple[str, ...] | None = None
        untracked(self)  # one per evicted run, held long: not walked by collections

    def _all(self) -> tuple[str, ...]:
        ids = self._ids
        if ids is None:
            ids = self._ids = msgpack.unpackb(self._packed, raw=False, use_list=False)
            self._packed = b""
        return ids

    def __len__(self) -> int:
        return self._count

    def unpacked(self) -> tuple[str, ...]:
        """The ids as str, without keeping them: they stay packed here (recovery gives
        them to the dedup window, which packs them its own way)."""
        if self._ids is not None:
            return self._ids
        ids: tuple[str, ...] = msgpack.unpackb(self._packed, raw=False, use_list=False)
        return ids

    @overload
    def __getitem__(self, index: int) -> str: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[str, ...]: ...

    def __getitem__(self, index: int | slice) -> str | tuple[str, ...]:
        return self._all()[index]

    def __iter__(self) -> Iterator[str]:
        return iter(self._all())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, PackedIds):
            other = other._all()
        return isinstance(other, tuple) and self._all() == other

    __hash__ = None  # type: ignore[assignment]  # equal to a tuple, so not hashable as one
