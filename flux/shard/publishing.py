"""PUBLISH: validation, the per-frame buffer limit, dedup (G3), TopicFull and storage.

A PUBLISH carries groups (one topic, a column of ids and one of payloads). The
usual group passes every check at once with C-speed bulk operations and is
stored with one extend (:meth:`Publishing._publish_fast`); any other group goes
item by item (:meth:`Publishing._publish_slow`). Both give the same results.
Subscriptions with room are marked for the next pump (``flux.shard.delivery``).
"""

from __future__ import annotations

from typing import Any

from flux import errors
from flux.message_meta import Meta, make_meta, meta_size
from flux.shard.dedup import EXPIRE_SLICE
from flux.shard.delayed import Delays, GroupOptions, group_options, record_meta
from flux.shard.journal import PUBLISH, TopicJournal
from flux.shard.state import (
    MESSAGE_COST,
    MESSAGE_FRAME_SLACK,
    REMEMBERED_ID_COST,
    P,
    Session,
    Topic,
)
from flux.shard.topic import payload_lengths

_BYTES = {bytes}
_STR = {str}
# 32 characters are at most 128 bytes of UTF-8: longer ids need the exact check
_SHORT_ID = 32


class Publishing(Delays):
    """The PUBLISH handler."""

    def _publish(self, session: Session, frame: list[Any], now: float) -> None:
        rid, groups = frame[1], frame[2]
        if type(groups) is not list:
            raise errors.InvalidRequest("PUBLISH groups must be an array")
        # the whole frame is checked before anything is stored
        options: list[GroupOptions | None] = []
        for group in groups:
            if (type(group) is not list or not 3 <= len(group) <= 4 or type(group[1]) is not list
                    or type(group[2]) is not list or len(group[1]) != len(group[2])):
                raise errors.InvalidRequest(
                    "a PUBLISH group is [topic, [id, ...], [payload, ...](, options)] with as"
                    " many ids as payloads")
            options.append(None if len(group) == 3 or group[3] is None
                           else group_options(group[3], len(group[1])))
        if self.draining:
            raise errors.ShuttingDown("shard is draining; reconnect and retry")
        results: list[list[Any]] = []
        counts: dict[str, int] = {}  # items per topic in this frame so far (topic.buffer)
        touched: dict[str, Topic] = {}
        journals: list[TopicJournal] = []  # disk topics whose records this reply waits for
        for group, opts in zip(groups, options, strict=True):
            name, ids, payloads = group[0], group[1], group[2]
            n = len(ids)
            if not n:
                results.append([[], [], []])
                continue
            try:
                name = self._check_owned(name)
                if session.identity is not None:  # auth (G13): one check per group
                    self._authorize(session, "publish", name)
            except errors.FluxError as exc:  # every item of the group is refused
                message = str(exc)
                results.append([[P.REFUSED] * n, [],
                                [[i, exc.code, message] for i in range(n)]])
                continue
            topic = touched.get(name)
            if topic is None:
                try:
                    topic = self._topic(name)
                except errors.StorageUnavailable as exc:
                    results.append(_refuse_all(n, exc))
                    continue
                touched[name] = topic
            journal = topic.journal
            before = 0
            if journal is not None:
                refusal = self._journal_refusal(topic, journal)
                if refusal is not None:
                    results.append(_refuse_all(n, refusal))
                    continue
                before = topic.log.next_offset
                if self.cache.used and self._short_of_room(topic, n):
                    self._make_room(topic, _need(ids, payloads), now)
            if topic.dedup.expire(now, EXPIRE_SLICE):  # a slice: the cleanup passes do the rest
                self._recount(topic)
            result = None
            if opts is None:
                result = self._publish_fast(topic, ids, payloads, counts, now)
            elif opts.keys is not None and opts.headers is None and opts.delays is None \
                    and opts.deliver_at is None:  # keys alone: the fast path takes them too
                result = self._publish_fast(topic, ids, payloads, counts, now, opts.keys)
            if result is None:
                result = self._publish_slow(topic, ids, payloads, counts, now, opts)
            if topic.generation != self.generation:  # a disk topic's own generation (G9)
                if len(result) > 3:
                    result[3] = topic.generation
                else:
                    result.append(topic.generation)
            results.append(result)
            if journal is not None:
                log = topic.log
                if log.next_offset != before:  # this group stored messages: one record
                    first, stored, packed = log.last_chunk()
                    wall = self.epoch + now
                    end = journal.append(PUBLISH, journal.publish_body(
                        first, wall, stored, packed, record_meta(
                            log.last_meta(), topic.delayed.column(first, len(stored))
                            if topic.delayed.last >= first else None, self.epoch)))
                    if journal.last_position >= 0:  # where its payloads can be read back
                        log.place(journal.last_position, end)
                    journal.expose_at(end, log.next_offset)
                    journal.published_at(end, log.next_offset, wall)
                if journal not in journals:
                    journals.append(journal)
        reply = [P.PUBLISHED, rid, self.generation, results]
        if journals:  # acks (and duplicates' acks) wait for durability (G9)
            self._journal_hold(session, reply, journals)
        else:
            session.out.append(reply)
        dirty = self._dirty
        for topic in touched.values():
            for sub in topic.subs.values():
                if sub.session is not None or sub.group is not None:
                    dirty[id(sub)] = sub

    def _short_of_room(self, topic: Topic, n: int) -> bool:
        """Whether a group of ``n`` items might not fit under ``shard.max_memory`` or the
        topic's ``topic.max_bytes`` (cheap: no item is looked at; a frame is at most
        ``max_frame_bytes``)."""
        most = 2 * self.config.max_frame_bytes + n * (MESSAGE_COST + REMEMBERED_ID_COST)
        return (self.memory + most > self.max_memory
                or topic.log.held_bytes + topic.dedup.held_bytes + most > topic.settings.max_bytes)

    def _journal_refusal(self, topic: Topic, journal: TopicJournal) -> errors.FluxError | None:
        """Why a disk topic takes no publishes now, if it does not."""
        if journal.failed is not None:
            return errors.StorageUnavailable(
                f"the log of topic {topic.name!r} is unavailable ({journal.failed});"
                " retry with the same ids")
        if self.disk_full is not None:
            return errors.StorageUnavailable(
                f"{self.disk_full}; disk topics take publishes again once there is room"
                " (retry with the same ids)")
        cap = topic.settings.storage_max_bytes
        if cap and journal.writer.size >= cap:
            return errors.TopicFull(f"topic {topic.name!r} has {journal.writer.size} bytes"
                                    f" on disk; storage.max_bytes={cap}")
        return None

    def _publish_fast(self, topic: Topic, ids: list[Any], payloads: list[Any],
                      counts: dict[str, int], now: float,
                      keys: list[Any] | None = None) -> list[Any] | None:
        """Store a whole group of new, valid messages at once (``keys``: one ASCII key
        each, if given); None (nothing done) when any item needs the exact per-item
        checks."""
        n = len(ids)
        meta = None
        key_bytes = longest_key = 0
        if keys is not None:
            meta = _ascii_keys(keys)
            if meta is None:
                return None
            key_bytes, longest_key = sum(meta.sizes), max(meta.sizes)
        name = topic.name
        count = counts.get(name, 0) + n
        if count > self.config.topic.buffer:
            return None
        try:
            # a str check of every id, and their total length, at C speed (a str
            # subclass passes, as it does the per-item check)
            id_bytes = len("".join(ids))
            id_lengths = bytes(map(len, ids))  # (ValueError: an id of 256 or more characters)
        except (TypeError, ValueError):
            return None
        longest_id = id_lengths[0]
        if id_lengths.count(longest_id) != n:  # ids of one length are the usual case
            longest_id = max(id_lengths)
            if min(id_lengths) < 1:
                return None
        if longest_id < 1 or longest_id > _SHORT_ID:
            return None
        if set(map(type, payloads)) != _BYTES:
            return None
        lens = payload_lengths(payloads)
        size = id_bytes + sum(lens)
        max_message = self.config.max_frame_bytes - MESSAGE_FRAME_SLACK
        # usually even the whole group fits in one message's room (cheaper than max())
        if (size - id_bytes + longest_id + longest_key > max_message
                and max(lens) + longest_id + longest_key > max_message):
            return None
        if topic.held_bytes(now) + size + key_bytes + id_bytes > topic.settings.max_bytes:
            return None
        log, dedup = topic.log, topic.dedup
        cost = size + key_bytes + n * MESSAGE_COST
        id_cost = dedup.id_cost
        if dedup.window > 0:
            cost += id_bytes + n * id_cost
        if self.memory + cost > self.max_memory:
            return None
        first = log.next_offset
        if dedup.window > 0:
            found = dedup.keys_for(ids)
            if len(found) != n or dedup.known_any(found):
                return None  # a duplicate (in the window or the group): the slow path says which
            chunk = tuple(ids)  # one tuple held by both the log and the dedup window
            dedup.remember_all(chunk, first, now, id_bytes, found)
            log.extend(chunk, payloads, now, size, lens, meta)
        else:
            log.extend(ids, payloads, now, size, lens, meta)
        counts[name] = count
        self.memory += cost
        topic.counted += cost
        if dedup.id_cost != id_cost:  # the window turned compact: its ids cost less now
            self._recount(topic)
        self.counters["published"] += n
        self.counters["bytes_in"] += size - id_bytes
        return [first, [], []]  # every item stored, at first .. first + n - 1

    def _publish_slow(self, topic: Topic, ids: list[Any], payloads: list[Any],
                      counts: dict[str, int], now: float,
                      opts: GroupOptions | None = None) -> list[Any]:
        """Check and store a group item by item (PROTOCOL.md §6.4 order); ``opts``: the
        group's keys, headers and delays, if it has any."""
        name = topic.name
        buffer = self.config.topic.buffer
        max_bytes = topic.settings.max_bytes
        max_message = self.config.max_frame_bytes - MESSAGE_FRAME_SLACK
        count = counts.get(name, 0)
        held = topic.held_bytes(now)
        memory, max_memory = self.memory, self.max_memory
        next_offset = topic.log.next_offset
        known = topic.dedup.finder(now)
        dedup_on = topic.dedup.window > 0  # a zero window remembers nothing (G3)
        offsets: list[int] = []
        duplicates: list[int] = []
        refused: list[list[Any]] = []
        new_ids: list[str] = []
        new_payloads: list[bytes] = []
        fresh: dict[str, int] = {}
        new_keys: list[str | None] = []
        new_headers: list[dict[str, str] | None] = []
        new_dues: list[float | None] = []
        dues: list[float | None] | None = None  # PUBLISHED's due column, once one is delayed
        key: str | None = None
        header: dict[str, str] | None = None
        due: float | None = None
        for i, (message_id, payload) in enumerate(zip(ids, payloads, strict=True)):
            if type(message_id) is not str or not 0 < len(message_id) <= _SHORT_ID:
                try:
                    P.check_message_id(message_id)
                except errors.FluxError as exc:
                    offsets.append(P.REFUSED)
                    refused.append([i, exc.code, str(exc)])
                    continue
            if type(payload) is not bytes:
                offsets.append(P.REFUSED)
                refused.append([i, errors.InvalidRequest.code,
                                f"payload must be binary, not {type(payload).__name__}"])
                continue
            size = len(payload) + len(message_id)
            if opts is not None:
                try:
                    key, header, due = opts.item(i, topic.settings.max_delay, self.epoch, now)
                except errors.FluxError as exc:
                    offsets.append(P.REFUSED)
                    refused.append([i, exc.code, str(exc)])
                    continue
                size += meta_size(key, header)
            if size > max_message:
                # stored, it could never be delivered or fetched in one frame (G8)
                offsets.append(P.REFUSED)
                refused.append([i, errors.MessageTooLarge.code,
                                f"a {len(payload)}-byte payload cannot be delivered in one"
                                f" frame; at most {max_message - len(message_id)} bytes with"
                                " this id"])
                continue
            count += 1
            if count > buffer:
                offsets.append(P.REFUSED)
                refused.append([i, errors.Busy.code,
                                f"more than topic.buffer={buffer} publishes of {name!r} in"
                                " one frame; retry with the same id"])
                continue
            original = known(message_id)
            if original is None and dedup_on:
                original = fresh.get(message_id)
            if original is not None:  # G3: before the TopicFull check
                offsets.append(original)
                duplicates.append(i)
                if original >= topic.log.next_offset:
                    # stored by this group: not indexed as delayed until the group is, so
                    # its due time comes from here (G12: the ack carries it either way)
                    fresh_due = new_dues[original - topic.log.next_offset] if new_dues else None
                    original_due = None if fresh_due is None else self.epoch + fresh_due
                else:
                    original_due = self._due_of(topic, original)
                if original_due is not None:
                    if dues is None:
                        dues = [None] * len(ids)
                    dues[i] = original_due
                continue
            size += len(message_id)  # the dedup window holds the id too
            if held + size > max_bytes:
                offsets.append(P.REFUSED)
                refused.append([i, errors.TopicFull.code,
                                f"topic {name!r} holds {held} bytes; topic.max_bytes={max_bytes}"])
                continue
            cost = size + MESSAGE_COST + (REMEMBERED_ID_COST if dedup_on
                                          else -len(message_id))
            if memory + cost > max_memory:
                offsets.append(P.REFUSED)
                refused.append([i, errors.TopicFull.code,
                                f"shard {self.index} holds about {memory} bytes of messages and"
                                f" ids; shard.max_memory={max_memory}"])
                continue
            held += size
            memory += cost
            fresh[message_id] = next_offset
            new_ids.append(message_id)
            new_payloads.append(payload)
            if opts is not None:
                new_keys.append(key)
                new_headers.append(header)
                new_dues.append(due)
                if due is not None:
                    if dues is None:
                        dues = [None] * len(ids)
                    dues[i] = self.epoch + due
            offsets.append(next_offset)
            next_offset += 1
        counts[name] = count
        if new_ids:
            # G2/G3: store the accepted messages and remember their ids
            stored = tuple(new_ids)  # one tuple held by both the log and the dedup window
            meta = None if opts is None else make_meta(new_keys, new_headers, len(new_ids))
            first = topic.log.extend(stored, new_payloads, now, meta=meta)
            topic.dedup.remember_all(stored, first, now)
            if dues is not None and any(due is not None for due in new_dues):
                self._hold_delayed(topic, first, new_dues)
            self._recount(topic)
            self.counters["published"] += len(new_ids)
            self.counters["bytes_in"] += sum(map(len, new_payloads))
        self.counters["duplicates"] += len(duplicates)
        if len(new_ids) == len(ids):  # every item stored new: the first offset stands for all
            result: list[Any] = [offsets[0], [], []]
        else:
            result = [offsets, duplicates, refused]
        if dues is not None:  # the due times of delayed items follow (G12)
            result += (None, dues)
        return result


def _need(ids: list[Any], payloads: list[Any]) -> int:
    """About the memory a group would take if every item were stored (0 if it is malformed:
    the checks refuse it anyway)."""
    try:
        return 2 * (sum(map(len, ids)) + sum(map(len, payloads))) + len(ids) * (
            MESSAGE_COST + REMEMBERED_ID_COST)
    except TypeError:
        return 0


def _ascii_keys(keys: list[Any]) -> Meta | None:
    """The :class:`Meta` of a group's keys when every one is an ASCII string of 1-255
    characters (so its length is its size), checked at C speed; None otherwise (the
    per-item path checks them exactly)."""
    try:
        if set(map(type, keys)) != _STR or not "".join(keys).isascii():
            return None
        sizes = bytes(map(len, keys))  # (ValueError: a key of 256 or more characters)
    except ValueError:
        return None
    if not sizes or min(sizes) < 1:
        return None
    return Meta(tuple(keys), None, tuple(sizes))


def _refuse_all(n: int, exc: errors.FluxError) -> list[Any]:
    """A group result refusing all ``n`` items with ``exc``."""
    message = str(exc)
    return [[P.REFUSED] * n, [], [[i, exc.code, message] for i in range(n)]]
