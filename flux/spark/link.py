"""Every call the Spark data source makes to the broker, through ``flux.client.trio``.

Spark calls data sources synchronously, so :func:`call` opens a client, runs one
async step under ``trio.run`` and closes it again; nothing (no socket, no lock)
outlives a call, which keeps readers and writers picklable. The steps below
hold the rules for resuming lost pull subscriptions and detecting lost data.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Iterator
from typing import Any, TypeVar

import trio

from flux import errors
from flux.client.tls import client_context
from flux.client.trio import Client, connect
from flux.spark import offsets
from flux.spark.offsets import Position, Range, TopicStatus

T = TypeVar("T")
# topic, message id, payload, key, headers
Item = tuple[str, str, bytes, str | None, dict[str, str] | None]
# offset, id, payload, timestamp, key, headers
Row = tuple[int, str, bytes, float, str | None, dict[str, str] | None]
FETCH_BATCH = 5000
FULL_BACKOFF = (0.05, 2.0)  # seconds between re-sends while a topic is full


def call(url: str, timeout: float, step: Callable[..., Awaitable[T]], *args: Any,
         credentials: dict[str, str] | None = None) -> T:
    """Run ``step(client, *args)`` with a fresh client (proving ``credentials``: token,
    or user and password; with TLS files ca, cert, key); raises what the step raises,
    or ``RequestTimeout`` when it takes longer than ``timeout`` seconds."""

    given = credentials or {}
    tls = client_context(url, None, ca=given.get("ca"), cert=given.get("cert"),
                         key=given.get("key"))

    async def main() -> T:
        with trio.move_on_after(timeout) as scope:
            async with connect(url, token=given.get("token"), user=given.get("user"),
                               password=given.get("password"), tls=tls) as client:
                return await step(client, *args)
        assert scope.cancelled_caught
        raise errors.RequestTimeout(f"a call to flux at {url} did not finish within {timeout:g}s"
                                    " (option 'timeout')")

    return trio.run(main)


async def _status(client: Client, topic: str, name: str | None, offset: int) -> TopicStatus:
    got = await client.fetch(topic, offset, max_messages=0, name=name)  # status only
    return TopicStatus(got.generation, got.oldest, got.next)


async def _resume(client: Client, topic: str, name: str, pos: Position | None) -> None:
    """Recreate a pull subscription that is gone (deleted while idle, or its shard
    restarted) at ``pos``, so cleanup keeps what the query has yet to read."""
    if pos is None:
        await client.subscribe_pull(topic, name, read_old=True)
        return
    try:
        await client.subscribe_pull(topic, name, from_offset=pos.next, generation=pos.generation)
    except errors.OffsetOutOfRange:  # cannot be past the end of its own generation; be safe
        await client.subscribe_pull(topic, name, read_old=True)


async def open_subscriptions(client: Client, topics: list[str], name: str,
                             starts: dict[str, offsets.Start]) -> offsets.Offsets:
    """Create (or find) the pull subscription of every topic at its start; returns
    the first position per topic. Raises ValueError for an offset past a topic's end."""
    out: offsets.Offsets = {}
    for topic in topics:
        start = starts[topic]
        try:
            if isinstance(start, Position):
                await client.subscribe_pull(topic, name, from_offset=start.next,
                                            generation=start.generation)
            elif isinstance(start, int):
                await client.subscribe_pull(topic, name, from_offset=start)
            else:
                await client.subscribe_pull(topic, name, read_old=start == offsets.EARLIEST)
        except errors.OffsetOutOfRange as exc:
            raise ValueError(f"option 'startingOffsets', topic {topic!r}: {exc}") from None
        status = await _status(client, topic, name, 0)
        out[topic] = offsets.resolve_start(start, status, topic)
    return out


async def statuses(client: Client, topics: list[str], name: str | None,
                   begin: offsets.Offsets | None) -> dict[str, TopicStatus]:
    """What each topic holds now. With a subscription ``name``, this also keeps it
    active, and recreates it at ``begin`` if it is gone."""
    out: dict[str, TopicStatus] = {}
    for topic in topics:
        pos = begin.get(topic) if begin is not None else None
        offset = pos.next if pos is not None else 0
        try:
            out[topic] = await _status(client, topic, name, offset)
        except errors.UnknownSubscription:
            assert name is not None
            await _resume(client, topic, name, pos)
            out[topic] = await _status(client, topic, name, offset)
    return out


async def commit_all(client: Client, name: str, end: offsets.Offsets) -> None:
    """COMMIT every topic's subscription cursor to ``end``. A topic whose generation
    changed is left alone: the next batch reports the reset."""
    for topic, pos in end.items():
        try:
            await client.commit(topic, name, pos.next, pos.generation)
        except errors.TopicReset:
            continue
        except errors.UnknownSubscription:
            await _resume(client, topic, name, pos)


async def fetch_range(client: Client, rng: Range, name: str | None, fail_on_data_loss: bool,
                      warn: offsets.Warn) -> list[Row]:
    """Exactly the messages ``rng`` names, in offset order; naming subscription
    ``name`` (if it still exists) keeps it active meanwhile. Raises
    :class:`~flux.spark.offsets.DataLoss` (``fail_on_data_loss``) when its shard
    restarted or part of it was cleaned up; otherwise warns and skips what is gone."""
    rows: list[Row] = []
    offset = rng.start
    while offset < rng.end:
        try:
            got = await client.fetch(rng.topic, offset,
                                     max_messages=min(FETCH_BATCH, rng.end - offset),
                                     name=name, generation=rng.generation)
        except errors.UnknownSubscription:
            name = None  # gone: the data may still be held; the driver recreates it
            continue
        except errors.TopicReset as exc:
            offsets.check_loss(fail_on_data_loss, warn,
                               f"topic {rng.topic!r} was reset (its shard restarted) before"
                               f" offsets {offset}..{rng.end - 1} of generation"
                               f" {rng.generation:#x} were read: {exc}.")
            return rows
        first = got.messages[0].offset if got.messages else min(max(got.oldest, offset), rng.end)
        if first > offset:
            if offset < got.oldest:  # below what is held: cleaned up (a hole above is not)
                offsets.check_loss(fail_on_data_loss, warn,
                                   f"topic {rng.topic!r}: offsets {offset}..{first - 1} of"
                                   f" generation {rng.generation:#x} were cleaned up before"
                                   " they were read.")
            offset = first
            continue
        if not got.messages:
            raise offsets.DataLoss(f"topic {rng.topic!r}: offsets {offset}..{rng.end - 1} are"
                                   f" not there (next offset is {got.next})")
        for m in got.messages:
            if m.offset >= rng.end:
                break
            rows.append((m.offset, m.id, m.payload, m.timestamp, m.key, m.headers or None))
        offset = rows[-1][0] + 1
    return rows


async def publish_all(client: Client, items: Iterable[Item], batch_size: int) -> tuple[int, int]:
    """Publish ``(topic, id, payload, key, headers)`` items, ``batch_size`` at a time, in order per
    topic; returns (stored, duplicates). ``TopicFull`` is waited out (the group is
    re-sent with the same ids, so what was stored is not stored twice) until the
    caller's timeout; other errors are raised once the client gave up retrying."""
    stored = duplicates = 0
    for chunk in _chunks(items, batch_size):
        by_topic: dict[str, list[Item]] = {}
        for item in chunk:
            by_topic.setdefault(item[0], []).append(item)
        for topic, group in by_topic.items():
            payloads, ids = [i[2] for i in group], [i[1] for i in group]
            keys = [i[3] for i in group]
            headers = [i[4] for i in group]
            pause = FULL_BACKOFF[0]
            while True:
                try:
                    acks = await client.publish_many(
                        topic, payloads, ids=ids,
                        keys=keys if any(k is not None for k in keys) else None,
                        headers=headers if any(headers) else None)
                    break
                except errors.TopicFull:
                    await trio.sleep(pause)
                    pause = min(pause * 2, FULL_BACKOFF[1])
            dup = sum(1 for ack in acks if ack.duplicate)
            duplicates += dup
            stored += len(acks) - dup
    return stored, duplicates


def _chunks(items: Iterable[Item], size: int) -> Iterator[list[Item]]:
    chunk: list[Item] = []
    for item in items:
        chunk.append(item)
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk
