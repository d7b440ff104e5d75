"""One topic's log of messages, held in memory (a disk topic's payloads may be evicted).

:class:`TopicLog` appends, reads ranges and trims the head. It knows nothing of
subscriptions or dedup (:mod:`flux.shard.dedup`); cleanup decides what may be
trimmed. A disk topic's log is *placed*: each chunk knows where its PUBLISH record
is in the topic's log on disk, and once that record is durable the chunk's payloads
may be evicted and read back from it on demand (:class:`ChunkStore`,
:mod:`flux.shard.cache`); ids, offsets and store times always stay in memory.
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import accumulate, islice, repeat
from operator import add, lt
from operator import sub as minus
from typing import Any, Protocol, cast

import msgpack

from flux import errors
from flux import protocol as P
from flux.acks import sorted_runs
from flux.message_meta import Meta, columns
from flux.shard.columns import column
from flux.shard.kept import Entry, KeptMessages, Placed, Resident
from flux.shard.packed_ids import PackedIds

_packer = msgpack.Packer(use_bin_type=True)
_ONE_BYTE = [bytes((n,)) for n in range(256)]  # the lengths of one short payload, shared
PACK_BELOW = 1024  # runs of payloads this large on average are held unpacked


def payload_lengths(payloads: Sequence[bytes]) -> bytes | array[int]:
    """The lengths of ``payloads`` as :meth:`TopicLog.extend` keeps them: one byte each
    when all are under 256 bytes (the usual case), else 4 bytes each."""
    if len(payloads) == 1 and len(payloads[0]) < 256:
        return _ONE_BYTE[len(payloads[0])]
    try:
        return bytes(map(len, payloads))
    except ValueError:  # a payload of 256 bytes or more
        return array("I", map(len, payloads))


def lengths_sum(lens: bytes | array[int]) -> int:
    """``sum(lens)``, at C speed when every length is one byte and the same (the usual
    run a recovery reads: summing 256 one-byte lengths took 4 us, most of a run's)."""
    n = len(lens)
    if n and type(lens) is bytes and lens.count(lens[0]) == n:
        return lens[0] * n
    return sum(lens)


class ChunkStore(Protocol):
    """Where a placed log's evicted payloads come back from, and the cache that counts
    its resident ones (:class:`flux.shard.cache.TopicPayloads` is one)."""

    def read(self, position: int, end: int, first: int) -> bytes:
        """The payloads of the PUBLISH record at ``position`` (ending at ``end``, holding
        offsets from ``first``), packed as one MessagePack array. Raises a FluxError
        (StorageUnavailable) if it cannot be read intact."""
        ...

    def durable(self) -> int:
        """The log position below which every record is durable."""
        ...

    def add(self, first: int, size: int, read: bool = False) -> None:
        """The chunk at ``first`` holds ``size`` payload bytes in memory now: just stored
        (the publish counted them), or ``read`` back from the log (not counted yet)."""
        ...

    def touch(self, first: int) -> None:
        """The chunk at ``first`` (resident) was read."""
        ...

    def drop(self, first: int) -> None:
        """The chunk at ``first`` no longer holds payloads in memory (trimmed or evicted)."""
        ...

    def read_kept(self, position: int, offsets: Sequence[int]) -> dict[int, Resident]:
        """The kept messages at ``offsets`` whole, read back from the KEEP record at
        ``position``. Raises a FluxError (StorageUnavailable) if it cannot be read intact."""
        ...


class DueTimes(Protocol):
    """Where a log finds its messages' due times (:class:`flux.shard.due_index.TopicDelays`)."""

    def __bool__(self) -> bool:
        """Whether any held message may be delayed."""
        ...

    def due_of(self, offset: int) -> float | None:
        """The due time (monotonic) of the message at ``offset`` (None: not delayed)."""
        ...


class TopicLog:
    """Messages of one topic at consecutive offsets; the oldest may be trimmed.

    Messages are held in *chunks*, one per stored run (a PUBLISH group): a tuple
    of ids, the payloads packed as one MessagePack array (the form DELIVER frames
    carry, so pushes splice them in without encoding them again) and their
    lengths (one byte each when all are under 256 bytes), with the run's first
    offset and store time in flat lists beside them. None of it is walked by the
    garbage collector (the lists are columns it does not track,
    :mod:`flux.shard.columns`), and a held small message costs a tuple slot, its id and its
    payload with a two-byte header and a length byte, not a bytes object. Runs of
    large payloads (over ``PACK_BELOW`` bytes on average) keep their bytes objects
    in a tuple instead: packing them would cost copies and save nothing worth it.

    A *placed* log (a disk topic's) also keeps each chunk's record position and end;
    an evicted chunk's payloads are ``None`` until :meth:`_load` reads them back.
    ``held_bytes`` counts only payloads held in memory (and every id).
    """

    __slots__ = ("_at", "_first", "_head", "_ids", "_kept", "_lens", "_meta", "_next",
                 "_packed", "_skip", "_store", "_where", "dues", "held_bytes", "metas")

    def __init__(self, start: int = 0, *, placed: bool = False) -> None:
        """An empty log whose first message gets offset ``start`` (a topic retired
        at that next offset and used again: offsets are never reused, G1); ``placed``:
        a disk topic's, whose chunks record where their PUBLISH records are."""
        self._first: list[int] = column()            # chunk k holds offsets from _first[k] ...
        self._ids: list[Sequence[str]] = column()    # ... with these ids (a tuple, or
        #                                              packed ones recovery kept) ...
        # ... these payloads (a MessagePack array, or a tuple of large ones) ...
        self._packed: list[bytes | tuple[bytes, ...] | None] = column()  # None: evicted
        self._lens: list[bytes | array[int]] = column()  # ... of these lengths ...
        self._at: list[float] = column()             # ... stored at this time ...
        self._meta: list[Meta | None] = column()     # ... with these keys and headers ...
        # ... in the record at (position, end) of the topic's log on disk, its payloads
        # taking this many bytes (placed logs; position -1: not known yet, never evicted)
        self._where: list[tuple[int, int, int]] | None = column() if placed else None
        self._store: ChunkStore | None = None  # set once the topic's log can be read back
        self._head = 0       # index of the oldest chunk still held
        self._skip = 0       # messages of the head chunk already trimmed
        self._next = start   # the offset the next message gets
        self.held_bytes = 0  # payload + id (+ key and header) bytes of held messages
        self.metas = 0       # chunks ever stored with a Meta (0: no message has one)
        self.dues: DueTimes | None = None  # its messages' due times (set by its topic)
        # messages trimmed from the chunks but still held, below ``oldest``, by offset (in
        # increasing order): delayed messages not yet ``ttl`` past their due time (G12, G5
        # per message), with their (key, headers, due); a placed log's leave memory once
        # their KEEP record is durable
        self._kept = KeptMessages()

    @property
    def store(self) -> ChunkStore | None:
        """Where a placed log's evicted payloads (and kept messages) come back from."""
        return self._store

    @store.setter
    def store(self, store: ChunkStore | None) -> None:
        self._store = store
        self._kept.reader = store.read_kept if store is not None else None

    @property
    def oldest(self) -> int:
        """Offset of the oldest held message (== ``next_offset`` when empty)."""
        if self._head == len(self._first):
            return self._next
        return self._first[self._head] + self._skip

    @property
    def next_offset(self) -> int:
        """The offset the next append gets; offsets are never reused."""
        return self._next

    def __len__(self) -> int:
        return self._next - self.oldest + len(self._kept)

    @property
    def lowest(self) -> int:
        """The lowest held offset, a kept one included (``oldest`` when none is kept)."""
        return self._kept.first() if self._kept else self.oldest

    def kept_from(self, offset: int) -> list[int]:
        """The kept offsets at or above ``offset`` (all below ``oldest``), increasing."""
        return [o for o in self._kept if o >= offset] if self._kept else []

    def kept(self, offset: int) -> Resident:
        """The kept message at ``offset``: its entry and (key, headers, due), read back
        from its KEEP record if it left memory (StorageUnavailable if that fails)."""
        return self._kept.get(offset)

    def kept_size(self, offset: int) -> int:
        """The id and payload bytes of the kept message at ``offset`` (never read back)."""
        return self._kept.size(offset)

    def hold_kept(self, offset: int, entry: Entry, key: str | None,
                  headers: dict[str, str] | None, due: float | None) -> None:
        """Hold a message out of line below ``oldest``, whole, in increasing offset order;
        its bytes count as held."""
        self.held_bytes += self._kept.hold(offset, (entry, (key, headers, due)))
        if key is not None or headers is not None:
            self.metas += 1  # (reads look for keys and headers only once some message has)

    def hold_placed(self, offset: int, placed: Placed, meta: bool) -> None:
        """Hold a message out of line below ``oldest`` that stays in its durable KEEP record
        (recovery), in increasing offset order; ``meta``: it has a key or headers."""
        self.held_bytes += self._kept.hold_placed(offset, placed)
        if meta:
            self.metas += 1

    def release(self, done: Callable[[int], bool]) -> list[int]:
        """Drop the kept messages whose offset ``done(offset)`` is true; returns them."""
        gone, freed = self._kept.release(done)
        self.held_bytes += freed
        return gone

    def kept_written(self, offsets: Sequence[int], position: int, end: int) -> None:
        """These kept messages are written whole in the KEEP record at ``position`` ..
        ``end``: they leave memory once it is durable (:meth:`settle_kept`)."""
        if self._store is not None:
            self._kept.written(offsets, position, end)

    def settle_kept(self, durable: int) -> bool:
        """Let the kept messages whose latest KEEP record ends at or below ``durable``
        leave memory; whether any did."""
        freed = self._kept.settle(durable)
        self.held_bytes += freed
        return freed != 0

    def recall_kept(self, offsets: Iterable[int]) -> None:
        """Hold these kept messages in memory again (read back: they are written anew).
        Raises StorageUnavailable if one cannot be read back intact."""
        self.held_bytes += self._kept.recall(offsets)

    def oldest_at(self) -> float:
        """When the oldest held message was stored (``inf`` when none is held)."""
        return self._at[self._head] if self._head < len(self._at) else math.inf

    def append(self, message_id: str, payload: bytes, now: float) -> int:
        """Store a message and return its offset."""
        return self.extend([message_id], [payload], now)

    def extend(self, ids: Sequence[str], payloads: Sequence[bytes], now: float,
               size: int | None = None, lens: bytes | array[int] | None = None,
               meta: Meta | None = None) -> int:
        """Store several messages at once (one chunk); returns the offset of the first.
        ``size``: their id and payload lengths summed, and ``lens``:
        :func:`payload_lengths` of them, if the caller already has them; ``meta``: their
        keys and headers, if any has one (their bytes count too)."""
        offset = self._next
        if ids:
            self._meta.append(meta)
            if meta is not None:
                self.metas += 1
                self.held_bytes += sum(meta.sizes)
            self._first.append(offset)
            self._ids.append(tuple(ids))
            if lens is None:
                lens = payload_lengths(payloads)
            large = type(lens) is not bytes and sum(lens) >= PACK_BELOW * len(lens)
            self._packed.append(tuple(payloads) if large else _packer.pack(payloads))
            self._lens.append(lens)
            self._at.append(now)
            self._next = offset + len(ids)
            if size is None:
                size = len("".join(ids)) + sum(lens)
            self.held_bytes += size
            if self._where is not None:
                payload_size = sum(lens)
                self._where.append((-1, -1, payload_size))
                if self.store is not None:
                    self.store.add(offset, payload_size)
        return offset

    def extend_placed(self, ids: Sequence[str], lens: bytes | array[int], now: float,
                      position: int, end: int, ids_size: int | None = None,
                      meta: Meta | None = None) -> int:
        """Hold a run whose payloads stay in the log (recovery): its ids and payload
        lengths (:func:`payload_lengths`), its ``meta`` if any, and where its durable
        record is. Returns the offset of the first. ``ids_size``: the ids' characters in
        all, if known (so that ids kept packed need not be unpacked to count them)."""
        assert self._where is not None, "only a placed log holds runs it has no payloads of"
        offset = self._next
        if ids:
            self._meta.append(meta)
            if meta is not None:
                self.metas += 1
                self.held_bytes += sum(meta.sizes)
            self._first.append(offset)
            self._ids.append(ids)
            self._packed.append(None)
            self._lens.append(lens)
            self._at.append(now)
            self._where.append((position, end, lengths_sum(lens)))
            self._next = offset + len(ids)
            self.held_bytes += len("".join(ids)) if ids_size is None else ids_size
        return offset

    def place(self, position: int, end: int) -> None:
        """The newest chunk's record is at ``position`` .. ``end`` of the topic's log."""
        if self._where is not None and self._where:
            self._where[-1] = (position, end, self._where[-1][2])

    @property
    def placed(self) -> bool:
        """Whether this log records where its chunks are on disk (a disk topic's)."""
        return self._where is not None

    def resident(self, first: int) -> bool:
        """Whether the held chunk starting at ``first`` has its payloads in memory."""
        k = self._chunk(first)
        return k >= self._head and self._first[k] == first and self._packed[k] is not None

    def evict(self, first: int) -> int:
        """Drop the payloads of the chunk starting at ``first`` from memory if its record is
        durable (they are read back on demand); returns the bytes freed (0: kept)."""
        store, where = self.store, self._where
        if store is None or where is None:
            return 0
        k = self._chunk(first)
        if k < self._head or self._first[k] != first or self._packed[k] is None:
            return 0
        position, end, size = where[k]
        if position < 0 or end > store.durable():
            return 0
        freed = sum(self._lens[k][self._skip:]) if k == self._head and self._skip else size
        self._packed[k] = None
        ids = self._ids[k]
        if type(ids) is tuple:  # a str each (~80 bytes) -> packed (its bytes and one more)
            self._ids[k] = PackedIds(_packer.pack(ids), len(ids))
        self.held_bytes -= freed
        store.drop(first)
        return freed

    def _load(self, k: int) -> bytes | tuple[bytes, ...]:
        """Chunk ``k``'s payloads, read back from its record if they were evicted."""
        packed = self._packed[k]
        if packed is not None:
            if self.store is not None:
                self.store.touch(self._first[k])
            return packed
        store, where = self.store, self._where
        if store is None or where is None:
            raise errors.StorageUnavailable("payloads not in memory, and no log to read them from")
        position, end, size = where[k]
        first, lens = self._first[k], self._lens[k]
        data = store.read(position, end, first)
        count = len(lens)
        base = 1 if count <= 15 else 3 if count <= 0xFFFF else 5
        headers = 2 * count if type(lens) is bytes else sum(map(P.bin_header_size, lens))
        if len(data) != base + size + headers:
            raise errors.StorageUnavailable(
                f"the record at log position {position} does not hold the payloads of"
                f" offsets {first}..{first + count - 1}")
        large = type(lens) is not bytes and size >= PACK_BELOW * count
        loaded: bytes | tuple[bytes, ...] = tuple(msgpack.unpackb(data)) if large else data
        self._packed[k] = loaded
        held = sum(lens[self._skip:]) if k == self._head and self._skip else size
        self.held_bytes += held
        store.add(first, held, read=True)
        return loaded

    def last_chunk(self) -> tuple[int, Sequence[str], bytes]:
        """The newest chunk (the last run stored): its first offset, its ids and its
        payloads packed as one MessagePack array (a disk topic's PUBLISH record)."""
        packed = self._packed[-1]  # just stored: in memory
        if packed is None:
            packed = self._load(len(self._packed) - 1)
        if isinstance(packed, tuple):
            packed = _packer.pack(list(packed))
        return self._first[-1], self._ids[-1], packed

    def last_meta(self) -> Meta | None:
        """The newest chunk's keys and headers (None: it has none)."""
        return self._meta[-1]

    def meta_of(self, offset: int) -> tuple[str | None, dict[str, str] | None, float | None]:
        """The key, headers and due time (monotonic; None: due when stored) of the held
        message at ``offset``."""
        if offset < self.oldest and offset in self._kept:
            return self._kept.get(offset)[1]
        due = self.dues.due_of(offset) if self.dues else None
        if not self.metas:
            return None, None, due
        k = self._chunk(offset)
        meta = self._meta[k]
        if meta is None:
            return None, None, due
        i = offset - self._first[k]
        return (meta.keys[i] if meta.keys is not None else None,
                meta.headers[i] if meta.headers is not None else None, due)

    def meta_columns(self, offsets: Sequence[int], epoch: float) -> dict[str, Any] | None:
        """The trailing map of a DELIVER or FETCHED of the held ``offsets``: their keys,
        headers and due times (wall: plus ``epoch``), only the columns any has a value in;
        None when none has (always, for a topic that never stored any)."""
        if not self.metas and not self.dues:
            return None
        keys: list[str | None] = []
        headers: list[dict[str, str] | None] = []
        kept, oldest = self._kept, self.oldest
        held: dict[int, Any] = {}
        if kept and not (type(offsets) is range and offsets.start >= oldest):
            held = kept.load([o for o in offsets if o < oldest and o in kept])
        if self.metas and type(offsets) is range and offsets.start >= oldest:
            keys, headers = self._meta_run(offsets.start, offsets.stop)  # (none kept)
        elif self.metas and offsets and offsets[0] >= oldest \
                and all(map(lt, offsets, islice(offsets, 1, None))):
            # in line and ascending (a member's share of a run): a chunk's share at once
            keys, headers = self._meta_spread(offsets)
        elif self.metas:
            for meta, i, o in self._metas_at(offsets):
                if meta is None:
                    key, header = held[o][1][:2] if o in held else (None, None)
                else:
                    key = meta.keys[i] if meta.keys is not None else None
                    header = meta.headers[i] if meta.headers is not None else None
                keys.append(key)
                headers.append(header)
        else:
            keys = [None] * len(offsets)
            headers = [None] * len(offsets)
        due_times = self.dues
        dues: list[float | None] = [None] * len(offsets)
        if due_times:
            for j, o in enumerate(offsets):
                due = held[o][1][2] if o in held else due_times.due_of(o)
                if due is not None:
                    dues[j] = epoch + due
        return columns(keys, headers, dues)

    def keys_of(self, offsets: Sequence[int]) -> list[str | None]:
        """The keys of the held ``offsets`` (None where a message has none)."""
        if not self.metas:
            return [None] * len(offsets)
        if type(offsets) is range and offsets.start >= self.oldest:
            return self._meta_run(offsets.start, offsets.stop)[0]
        out: list[str | None] = []
        for meta, i, o in self._metas_at(offsets):
            if meta is None:
                out.append(self._kept.key(o) if o in self._kept else None)
            else:
                out.append(meta.keys[i] if meta.keys is not None else None)
        return out

    def _meta_run(self, start: int, stop: int
                  ) -> tuple[list[str | None], list[dict[str, str] | None]]:
        """Keys and headers of the in-line offsets ``start`` to ``stop - 1``, a slice of a
        chunk at a time."""
        keys: list[str | None] = []
        headers: list[dict[str, str] | None] = []
        k, pos = self._chunk(start), start
        while pos < stop:
            first = self._first[k]
            a, b = pos - first, min(stop - first, len(self._ids[k]))
            meta = self._meta[k]
            if meta is not None and meta.keys is not None:
                keys += meta.keys[a:b]
            else:
                keys += [None] * (b - a)
            if meta is not None and meta.headers is not None:
                headers += meta.headers[a:b]
            else:
                headers += [None] * (b - a)
            pos = first + b
            k += 1
        return keys, headers

    def _meta_spread(self, offsets: Sequence[int]
                     ) -> tuple[list[str | None], list[dict[str, str] | None]]:
        """Keys and headers of in-line ``offsets`` (ascending), a chunk's share at once."""
        keys: list[str | None] = []
        headers: list[dict[str, str] | None] = []
        i, n = 0, len(offsets)
        while i < n:
            k = self._chunk(offsets[i])
            first = self._first[k]
            j = bisect_left(offsets, first + len(self._ids[k]), i + 1)
            group = offsets[i:j]
            meta = self._meta[k]
            if meta is not None and meta.keys is not None:
                keys.extend(map(meta.keys.__getitem__, map(minus, group, repeat(first))))
            else:
                keys.extend([None] * len(group))
            if meta is not None and meta.headers is not None:
                headers.extend(map(meta.headers.__getitem__, map(minus, group, repeat(first))))
            else:
                headers.extend([None] * len(group))
            i = j
        return keys, headers

    def _metas_at(self, offsets: Iterable[int]) -> Iterator[tuple[Meta | None, int, int]]:
        """For each held offset: its chunk's :class:`Meta` (None: the chunk has none, or
        the offset is kept out of line), its index in that chunk, and the offset. Walks
        offsets near each other without a search per offset."""
        firsts, ids, metas = self._first, self._ids, self._meta
        oldest = self.oldest
        lo = hi = 0
        meta: Meta | None = None
        for o in offsets:
            if not lo <= o < hi:
                if o < oldest:  # kept out of line (or not held)
                    yield None, 0, o
                    continue
                k = self._chunk(o)
                lo = firsts[k]
                hi = lo + len(ids[k])
                meta = metas[k]
            yield meta, o - lo, o

    def _keep(self, k: int, a: int, b: int, keep: Callable[[int, int], Iterable[int]]) -> None:
        """Items ``a`` to ``b - 1`` of chunk ``k`` are trimmed: hold those ``keep`` names out
        of line (their bytes stay counted)."""
        first = self._first[k]
        for o in keep(first + a, first + b):
            i = o - first
            entry = Entry(self._ids[k][i], self._payloads(k, i, i + 1)[0], self._at[k])
            self.held_bytes += self._kept.hold(o, (entry, self.meta_of(o)))

    def _chunk(self, offset: int) -> int:
        """Index of the chunk holding ``offset`` (held, or the newest chunk's next)."""
        return bisect_right(self._first, offset, self._head) - 1

    def _position(self, k: int, i: int) -> int:
        """Where item ``i`` of chunk ``k`` starts in its packed array (``i`` may be its
        count: then the end)."""
        lens = self._lens[k]
        count = len(lens)
        if i >= count:
            return len(cast(bytes, self._packed[k]))  # the caller loaded it
        base = 1 if count <= 15 else 3 if count <= 0xFFFF else 5  # the array header
        if i == 0:
            return base
        if type(lens) is bytes:  # every payload under 256 bytes: two-byte headers
            return base + sum(lens[:i]) + 2 * i
        return base + sum(lens[:i]) + sum(map(P.bin_header_size, lens[:i]))

    def _payloads(self, k: int, a: int, b: int) -> list[bytes]:
        """Payloads ``a`` to ``b - 1`` of chunk ``k`` as bytes objects."""
        packed = self._load(k)
        if isinstance(packed, tuple):
            return list(packed[a:b])
        start, end = self._position(k, a), self._position(k, b)
        items: list[bytes] = msgpack.unpackb(P.array_header(b - a) + packed[start:end])
        return items

    def stored_at(self, offset: int) -> float:
        """When the message at ``offset`` (held) was stored."""
        if offset < self.oldest and offset in self._kept:
            return self._kept.get(offset)[0].stored_at
        return self._at[self._chunk(offset)]

    def columns(self, offsets: Sequence[int], epoch: float = 0.0
                ) -> tuple[list[str], list[bytes], list[float | int]]:
        """Ids, payloads and store-time runs (plus ``epoch``) of held ``offsets`` (any
        order, kept ones too). Neighbours in one chunk (a member's share of a run: every
        few offsets) have their payloads unpacked together, not one by one."""
        ids: list[str] = []
        payloads: list[bytes] = []
        times: list[float] = []
        oldest, end, n = self.oldest, self._next, len(offsets)
        kept = self._kept
        held = kept.load([o for o in offsets if o < oldest]) if kept else {}
        ascending = all(map(lt, offsets, islice(offsets, 1, None)))
        i = 0
        while i < n:
            o = offsets[i]
            if not oldest <= o < end:
                entry = held[o][0]  # the caller makes sure it is held
                ids.append(entry.id)
                payloads.append(entry.payload)
                times.append(epoch + entry.stored_at)
                i += 1
                continue
            k = self._chunk(o)
            first = self._first[k]
            low, high = max(first, oldest), min(end, first + len(self._lens[k]))
            if ascending:  # (the usual case) the chunk's share ends where ``high`` would go
                j = bisect_left(offsets, high, i + 1)
                lo, hi = o, offsets[j - 1]
            else:
                j, lo, hi = i + 1, o, o
                while j < n and low <= offsets[j] < high:
                    lo, hi = min(lo, offsets[j]), max(hi, offsets[j])
                    j += 1
            group = offsets[i:j]
            ids.extend(map(self._ids[k].__getitem__, map(minus, group, repeat(first))))
            if hi - lo < 8 * len(group):
                items = self._payloads(k, lo - first, hi - first + 1)
                payloads.extend(map(items.__getitem__, map(minus, group, repeat(lo))))
            else:  # far apart: one by one
                payloads.extend([self._payloads(k, x - first, x - first + 1)[0] for x in group])
            times.extend([epoch + self._at[k]] * len(group))
            i = j
        return ids, payloads, P.time_runs(times)

    def spans(self, offsets: Sequence[int], epoch: float = 0.0
              ) -> tuple[list[str], P.PackedPayloads, list[float | int]] | None:
        """:meth:`span` of each run of increasing, in-line ``offsets``, joined (what a
        key-ordered member is pushed: a few runs of its keys' offsets), its payloads
        left packed; None when they are not increasing, some is kept, they make many
        short runs, or a chunk holds them unpacked (:meth:`columns` then)."""
        n = len(offsets)
        if not n or offsets[0] < self.oldest or offsets[-1] >= self._next \
                or not all(map(lt, offsets, islice(offsets, 1, None))):
            return None
        runs = sorted_runs(offsets)
        if len(runs) * 4 > n:
            return None
        ids: list[str] = []
        parts: list[bytes | memoryview] = []
        times: list[float | int] = []
        size = 0
        for start, stop in runs:
            run_ids, payloads, run_times = self.span(start, stop, epoch)
            if type(payloads) is not P.PackedPayloads:
                return None
            ids += run_ids
            parts += payloads.parts
            size += payloads.size
            if times and times[-2] == run_times[0]:  # runs of one chunk: one time run
                times[-1] += run_times[1]
                times += run_times[2:]
            else:
                times += run_times
        return ids, P.PackedPayloads(parts, n, size), times

    def holds(self, offset: int) -> bool:
        """Whether the message at ``offset`` is held (its payload is not read)."""
        return self.oldest <= offset < self._next or (bool(self._kept) and offset in self._kept)

    def get(self, offset: int) -> Entry | None:
        """The entry at ``offset`` if it is held."""
        if not self.oldest <= offset < self._next:
            return self._kept.get(offset)[0] if offset in self._kept else None
        k = self._chunk(offset)
        i = offset - self._first[k]
        return Entry(self._ids[k][i], self._payloads(k, i, i + 1)[0], self._at[k])

    def span(self, start: int, stop: int, epoch: float = 0.0
             ) -> tuple[list[str], P.PackedPayloads | list[bytes], list[float | int]]:
        """Ids, payloads (packed, as DELIVER carries them, unless some are held
        unpacked) and store times (plus ``epoch``, as ``[time, count, ...]``
        runs, one per chunk) of the held offsets ``start`` to ``stop - 1`` (the caller
        makes sure they are held)."""
        ids: list[str] = []
        parts: list[bytes | memoryview] = []
        times: list[float | int] = []
        size = 0
        k = self._chunk(start)
        last = self._chunk(stop - 1)
        if self.store is not None:  # a disk topic's: read evicted chunks back first
            for j in range(k, last + 1):
                self._load(j)
        if any(type(self._packed[j]) is tuple for j in range(k, last + 1)):
            return self._span_unpacked(k, start, stop, epoch)
        pos = start
        while pos < stop:
            first, chunk_ids, lens = self._first[k], self._ids[k], self._lens[k]
            a, b = pos - first, min(stop - first, len(chunk_ids))
            if a == 0 and b == len(chunk_ids):
                ids += chunk_ids
                size += sum(lens)
            else:
                ids += chunk_ids[a:b]
                size += sum(lens[a:b])
            packed = cast(bytes, self._packed[k])  # checked above: no chunk here is a tuple
            parts.append(memoryview(packed)[self._position(k, a):self._position(k, b)])
            times += (epoch + self._at[k], b - a)
            pos = first + b
            k += 1
        return ids, P.PackedPayloads(parts, stop - start, size), times

    def _span_unpacked(self, k: int, start: int, stop: int, epoch: float
                       ) -> tuple[list[str], list[bytes], list[float | int]]:
        """:meth:`span` as plain lists, from chunk ``k`` on."""
        ids: list[str] = []
        payloads: list[bytes] = []
        times: list[float | int] = []
        pos = start
        while pos < stop:
            first, chunk_ids = self._first[k], self._ids[k]
            a, b = pos - first, min(stop - first, len(chunk_ids))
            ids += chunk_ids[a:b]
            payloads += self._payloads(k, a, b)
            times += (epoch + self._at[k], b - a)
            pos = first + b
            k += 1
        return ids, payloads, times

    def fit(self, start: int, max_messages: int, max_bytes: int) -> range:
        """The held offsets a read from ``start`` returns: at most ``max_messages``, and
        at most ``max_bytes`` of payloads and ids (always one at least, if any is held
        and ``max_messages`` > 0). Starts at ``max(start, oldest)``."""
        offset = max(start, self.oldest)
        limit = min(self._next, offset + max(0, max_messages))
        if offset >= limit:
            return range(offset, offset)
        stop, size = offset, 0
        k = self._chunk(offset)
        while stop < limit:
            first, ids, lens = self._first[k], self._ids[k], self._lens[k]
            a, b = stop - first, min(len(ids), limit - first)
            chunk_size = sum(lens[a:b]) + len("".join(ids[a:b]))
            if size + chunk_size > max_bytes:  # the budget ends in this chunk: where?
                sizes = list(accumulate(map(add, lens[a:b], map(len, ids[a:b])),
                                        initial=size))
                fits = bisect_right(sizes, max_bytes) - 1  # items of a..b within budget
                return range(offset, max(stop + fits, offset + 1))
            size += chunk_size
            stop = first + b
            k += 1
        return range(offset, stop)

    def trim(self, below: int, stored_before: float, most: int | None = None,
             keep: Callable[[int, int], Iterable[int]] | None = None) -> int:
        """Drop held messages with offset < ``below`` stored at or before
        ``stored_before`` (at most ``most`` of them); stops at the first that must
        stay (store times are walked in order). The offsets ``keep(start, stop)`` names
        among each range it drops leave the chunks but stay held, out of line, payloads in
        memory (a placed log reads evicted ones back). Returns the count dropped, kept ones
        included."""
        firsts, ats, ids, packed, lengths, metas = (self._first, self._at, self._ids,
                                                    self._packed, self._lens, self._meta)
        store = self.store
        budget = most if most is not None else self._next
        dropped = 0
        k, skip = self._head, self._skip
        while k < len(firsts) and ats[k] <= stored_before and budget > 0:
            first, chunk_ids, lens = firsts[k], ids[k], lengths[k]
            a = skip
            b = min(len(chunk_ids), below - first, a + budget)
            if b <= a:
                break
            if keep is not None:
                try:
                    self._keep(k, a, b, keep)  # (reads evicted payloads back)
                except errors.StorageUnavailable:
                    break  # damage read back: the shard stops, and recovery sets it aside
            resident = packed[k] is not None
            if a == 0 and b == len(chunk_ids):
                self.held_bytes -= len("".join(chunk_ids)) + (sum(lens) if resident else 0)
            else:
                self.held_bytes -= (len("".join(chunk_ids[a:b]))
                                    + (sum(lens[a:b]) if resident else 0))
            meta = metas[k]
            if meta is not None:
                self.held_bytes -= sum(meta.sizes[a:b])
            dropped += b - a
            budget -= b - a
            if b < len(chunk_ids):
                skip = b
                break
            ids[k] = ()  # release the messages now, not at compaction
            packed[k] = lengths[k] = b""
            metas[k] = None
            if store is not None and resident:
                store.drop(first)
            k, skip = k + 1, 0
        held: list[list[Any]] = [firsts, ats, ids, packed, lengths, metas]
        if self._where is not None:
            held.append(self._where)
        if k == len(firsts):
            for values in held:
                values.clear()
            k = 0
        elif k > 64 and k * 2 > len(firsts):
            for values in held:
                del values[:k]
            k = 0
        self._head, self._skip = k, skip
        return dropped
