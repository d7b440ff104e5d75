"""PUBLISH: validation, the per-frame buffer limit, dedup (G3), TopicFull and storage.

Stored runs of messages are appended in one step; subscriptions with room are
marked for the next pump (``flux.shard.delivery``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from flux import errors
from flux.shard.state import (
    MESSAGE_FRAME_SLACK,
    P,
    Session,
    ShardState,
    Topic,
    _err,
    _nothing,
)


class Publishing(ShardState):
    """The PUBLISH handler."""

    def _publish(self, session: Session, frame: list[Any], now: float) -> None:
        rid, items = frame[1], frame[2]
        if not isinstance(items, list):
            raise errors.InvalidRequest("PUBLISH items must be an array")
        if self.draining:
            raise errors.ShuttingDown("shard is draining; reconnect and retry")
        results: list[list[Any]] = []
        add = results.append
        counts: dict[str, int] = {}
        buffer = self.config.topic.buffer
        max_bytes = self.config.topic.max_bytes
        max_message = self.config.max_frame_bytes - MESSAGE_FRAME_SLACK
        touched: dict[str, Topic] = {}
        # The hot loop. Items of a frame mostly share a topic: a run of items of one
        # topic is checked against its dedup window and the run's own new ids, and
        # stored at the end of the run with one extend.
        name: Any = None
        topic: Topic | None = None
        count = held = next_offset = duplicates = 0
        dedup_on = True
        known: Callable[[str], int | None] = _nothing
        new_ids: list[str] = []
        new_payloads: list[bytes] = []
        fresh: dict[str, int] = {}
        for item in items:
            if type(item) is not list:
                add(_err(errors.InvalidRequest, "a publish item is [topic, id, payload]"))
                continue
            try:
                item_topic, message_id, payload = item
            except ValueError:
                add(_err(errors.InvalidRequest, "a publish item is [topic, id, payload]"))
                continue
            if item_topic != name or topic is None:
                if topic is not None:
                    counts[name] = count
                    self._store_run(topic, new_ids, new_payloads, fresh, now)
                    new_ids, new_payloads, fresh = [], [], {}
                try:
                    name = self._check_owned(item_topic)
                except errors.FluxError as exc:
                    add([exc.code, str(exc), None])
                    name = topic = None
                    continue
                topic = self._topic(name)
                touched[name] = topic
                count = counts.get(name, 0)
                topic.dedup.expire(now)  # before reading held bytes: expired ids free theirs
                held = topic.held_bytes
                next_offset = topic.log.next_offset
                known = topic.dedup.finder()
                dedup_on = topic.dedup.window > 0  # a zero window remembers nothing (G3)
            if type(message_id) is not str or not 0 < len(message_id) <= 32:
                try:  # 32 characters are at most 128 bytes of UTF-8: longer ids are checked
                    P.check_message_id(message_id)
                except errors.FluxError as exc:
                    add([exc.code, str(exc), None])
                    continue
            if type(payload) is not bytes:
                add(_err(errors.InvalidRequest,
                         f"payload must be binary, not {type(payload).__name__}"))
                continue
            size = len(payload) + len(message_id)
            if size > max_message:
                # stored, it could never be delivered or fetched in one frame (G8)
                add(_err(errors.MessageTooLarge,
                         f"a {len(payload)}-byte payload cannot be delivered in one frame;"
                         f" at most {max_message - len(message_id)} bytes with this id"))
                continue
            count += 1
            if count > buffer:
                add(_err(errors.Busy, f"more than topic.buffer={buffer} publishes of {name!r}"
                                      " in one frame; retry with the same id"))
                continue
            original = known(message_id)
            if original is None and dedup_on:
                original = fresh.get(message_id)
            if original is not None:  # G3: before the TopicFull check
                duplicates += 1
                add([P.OK, original, True])
                continue
            size += len(message_id)  # the dedup window holds the id too
            if held + size > max_bytes:
                add(_err(errors.TopicFull, f"topic {name!r} holds {held} bytes;"
                                           f" topic.max_bytes={max_bytes}"))
                continue
            held += size
            fresh[message_id] = next_offset
            new_ids.append(message_id)
            new_payloads.append(payload)
            add([P.OK, next_offset, False])
            next_offset += 1
        if topic is not None:
            self._store_run(topic, new_ids, new_payloads, fresh, now)
        self.counters["duplicates"] += duplicates
        session.out.append([P.PUBLISHED, rid, self.generation, results])
        for topic in touched.values():
            for sub in topic.subs.values():
                if sub.session is not None:
                    self._dirty[id(sub)] = sub

    def _store_run(self, topic: Topic, ids: list[str], payloads: list[bytes],
                   fresh: dict[str, int], now: float) -> None:
        """Store a run of accepted publishes of one topic (G2) and remember their ids (G3)."""
        if ids:
            topic.log.extend(ids, payloads, now)
            topic.dedup.remember_all(fresh, now)
            self.counters["published"] += len(ids)
