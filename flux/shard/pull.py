"""The pull path: FETCH a range of held messages and COMMIT a pull cursor.

What the Spark source and replay tools use; pull subscriptions get no pushes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from flux import errors
from flux.shard.state import (
    FETCH_MAX_MESSAGES,
    P,
    Session,
    ShardState,
    Topic,
    _map,
    _opt_int,
)
from flux.shard.subscription import Subscription
from flux.shard.topic import TopicLog


class Pull(ShardState):
    """The FETCH and COMMIT handlers."""

    def _pull_sub(self, topic: Topic | None, name: Any, now: float) -> Subscription:
        sub = topic.subs.get(name) if topic is not None and isinstance(name, str) else None
        if sub is None:
            raise errors.UnknownSubscription(
                f"no pull subscription {name!r}; SUBSCRIBE with mode 'pull' first")
        if sub.mode != "pull":
            raise errors.InvalidRequest(f"subscription {name!r} is a push subscription")
        sub.active = True
        sub.last_activity = now
        return sub

    def _check_generation(self, opts: dict[str, Any], name: str) -> int:
        """The topic's generation; TopicReset if the request names another."""
        topic = self.topics.get(name)
        current = topic.generation if topic is not None else self.generation
        generation = _opt_int(opts, "generation")  # a non-integer is InvalidRequest (G8)
        if generation is not None and generation != current:
            raise errors.TopicReset(
                f"topic {name!r} was reset: generation {generation} -> {current}",
                old=generation, new=current)
        return current

    def _fetch(self, session: Session, frame: list[Any], now: float) -> None:
        rid, opts = frame[1], _map(frame, 2)
        name = self._authorize(session, "subscribe", self._check_owned(opts.get("topic"), True))
        generation = self._check_generation(opts, name)
        offset = _opt_int(opts, "offset") or 0
        max_messages = _opt_int(opts, "max_messages")  # 0: only "oldest" and "next"
        max_messages = min(1000 if max_messages is None else max_messages, FETCH_MAX_MESSAGES)
        max_bytes = min(_opt_int(opts, "max_bytes") or (1 << 20),
                        self.config.max_frame_bytes // 2)
        if offset < 0 or max_messages < 0 or max_bytes < 0:
            raise errors.InvalidRequest("offset, max_messages and max_bytes must be >= 0")
        topic = self.topics.get(name)
        if opts.get("name") is not None:
            self._pull_sub(topic, opts.get("name"), now)
        # a topic it holds no log of (never used, or retired) reads as empty at its next
        # offset, as a held topic whose messages were all cleaned up does
        oldest = next_offset = self._next_offset(name)
        first = max(offset, oldest)
        ids: list[str] = []
        payloads: Sequence[bytes] = []
        times: list[float | int] = []
        meta: dict[str, Any] | None = None
        first_field: int | list[int]
        if topic is not None:
            log = topic.log
            oldest, next_offset = log.lowest, topic.exposed  # nothing not durable (G9)
            max_messages = max(0, min(max_messages, next_offset - max(offset, oldest)))
            if oldest < log.oldest and offset < log.oldest:
                # delayed messages held out of line below the rest (G5 per message): a
                # page with holes, its offsets one by one
                page = self._page_with_holes(log, offset, next_offset, max_messages, max_bytes)
                first_field = page
                if page:
                    ids, payloads, times = log.columns(page, self.epoch)
                    meta = log.meta_columns(page, self.epoch)
            else:
                span = log.fit(offset, max_messages, max_bytes)
                first = first_field = span.start
                if span:
                    ids, payloads, times = log.span(span.start, span.stop, self.epoch)
                    if log.metas or topic.delayed:  # keys, headers, due times (G12: whatever is due)
                        meta = log.meta_columns(span, self.epoch)
        else:
            first_field = first
        reply = [P.FETCHED, rid, {"generation": generation, "oldest": oldest,
                                  "next": next_offset}, first_field, ids, payloads, times]
        if meta is not None:
            reply.append(meta)
        session.out.append(reply)

    @staticmethod
    def _page_with_holes(log: TopicLog, offset: int, end: int, max_messages: int,
                         max_bytes: int) -> list[int]:
        """The offsets a read from ``offset`` returns when some are held out of line
        below the log's contiguous run: those first, then the run up to ``end`` (the
        exposed end: a disk topic's, G9), within the limits (at least one message when
        any is held at or after ``offset``)."""
        page: list[int] = []
        size = 0
        for o in log.kept_from(offset):
            size += log.kept_size(o)  # (a disk topic's stays in its KEEP record until read)
            if len(page) >= max_messages or (page and size > max_bytes):
                return page
            page.append(o)
        if len(page) < max_messages and size < max_bytes:
            run = log.fit(log.oldest, min(max_messages - len(page), end - log.oldest),
                          max_bytes - size)
            if page and len(run) == 1:  # fit gives one message even over the budget
                entry = log.get(run.start)
                if entry is not None and size + len(entry.id) + len(entry.payload) > max_bytes:
                    return page
            page += run
        return page

    def _commit(self, session: Session, frame: list[Any], now: float) -> None:
        rid, opts = frame[1], _map(frame, 2)
        name = self._authorize(session, "subscribe", self._check_owned(opts.get("topic"), True))
        self._check_generation(opts, name)
        offset = _opt_int(opts, "offset")
        topic = self.topics.get(name)
        sub = self._pull_sub(topic, opts.get("name"), now)
        assert topic is not None
        if offset is None or offset < 0 or offset > topic.log.next_offset:
            raise errors.OffsetOutOfRange(
                f"commit offset {offset} is outside 0..{topic.log.next_offset}")
        sub.commit(offset)
        reply = [P.COMMITTED, rid, {"cursor": sub.cursor}]
        journal = self._journal_cursor(topic, sub)
        if journal is not None:
            self._journal_hold(session, reply, [journal])  # a confirmed commit is durable (G9)
        else:
            session.out.append(reply)
