"""Bugs planted on purpose in the shard (by patching, never in the source) to prove
that the simulator and its checker catch them. Each entry is a context manager."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

from flux import errors, protocol
from flux.client.dispatch import Dispatch
from flux.client.requests import PublishPart
from flux.shard import server as shard_server
from flux.shard.core import ShardCore
from flux.shard.dedup import DedupWindow
from flux.shard.subscription import Subscription
from flux.shard.topic import TopicLog


def _wrap(owner: Any, name: str, make: Callable[[Any], Any]) -> contextlib.AbstractContextManager[Any]:
    return mock.patch.object(owner, name, make(getattr(owner, name)))


def _with_config(core: ShardCore, **subscriber: Any) -> contextlib.AbstractContextManager[None]:
    @contextlib.contextmanager
    def patched() -> Iterator[None]:
        original = core.config
        core.config = dataclasses.replace(
            original, subscriber=dataclasses.replace(original.subscriber, **subscriber))
        try:
            yield
        finally:
            core.config = original
    return patched()


def skip_dedup() -> contextlib.AbstractContextManager[Any]:
    """G3: every publish is stored again, retries included."""
    stack = contextlib.ExitStack()
    # the per-item path asks finder(), the fast path known_any() (and leaves hits to finder)
    stack.enter_context(_wrap(DedupWindow, "finder",
                              lambda f: lambda self: lambda message_id: None))
    stack.enter_context(_wrap(DedupWindow, "known_any", lambda f: lambda self, ids: False))
    return stack


def duplicate_wrong_offset() -> contextlib.AbstractContextManager[Any]:
    """G3: a duplicate's ack carries the wrong offset."""
    def make(f: Any) -> Any:
        def finder(self: DedupWindow, now: float) -> Callable[[str], int | None]:
            get = f(self, now)

            def shifted(message_id: str) -> int | None:
                found = get(message_id)
                return None if found is None else found + 1
            return shifted
        return finder
    return _wrap(DedupWindow, "finder", make)


def delete_on_ttl_alone() -> contextlib.AbstractContextManager[Any]:
    """G5: cleanup ignores the subscriptions' cursors."""
    return _wrap(TopicLog, "trim",
                 lambda f: lambda self, below, before, most=None: f(self, 1 << 62, before, most))


def cursor_before_ack() -> contextlib.AbstractContextManager[Any]:
    """G1/G2: the cursor moves past a message when it is first pushed, not when acked."""
    def make(f: Any) -> Any:
        def add_deadlines(self: Subscription, at: float, offsets: list[int], pushes: int) -> None:
            f(self, at, offsets, pushes)
            if pushes == 1 and offsets and offsets[-1] >= self.cursor:
                self.cursor = offsets[-1] + 1
        return add_deadlines
    return _wrap(Subscription, "add_deadlines", make)


def ack_ignored() -> contextlib.AbstractContextManager[Any]:
    """G4: an acked message stays in flight, so it is pushed again."""
    def make(f: Any) -> Any:
        def ack(self: Subscription, offset: int) -> bool:
            pushes = self.in_flight.get(offset)
            done: bool = f(self, offset)
            if done and pushes is not None:
                self.in_flight[offset] = pushes
            return done
        return ack

    def make_through(f: Any) -> Any:
        def ack_through(self: Subscription, through: int) -> int:
            kept = {o: p for o, p in self.in_flight.items() if o <= through}
            done: int = f(self, through)
            self.in_flight.update(kept)
            return done
        return ack_through

    stack = contextlib.ExitStack()
    stack.enter_context(_wrap(Subscription, "ack", make))
    stack.enter_context(_wrap(Subscription, "ack_through", make_through))
    return stack


def redeliver_whole_window() -> contextlib.AbstractContextManager[Any]:
    """G4: when one push times out, every in-flight message is pushed again."""
    def make(f: Any) -> Any:
        def redeliver(self: ShardCore, sub: Subscription, due: list[tuple[float, int, int]]) -> None:
            at = due[0][0] if due else 0.0
            listed = {offset for _, offset, _ in due}
            extra = [(at, o, p) for o, p in sub.in_flight.items() if o not in listed]
            f(self, sub, due + extra)
        return redeliver
    return _wrap(ShardCore, "_redeliver", make)


def no_retry_interval() -> contextlib.AbstractContextManager[Any]:
    """G4: re-pushes ignore retry_interval (come too early)."""
    def make(f: Any) -> Any:
        def run_timers(self: ShardCore, sub: Subscription, now: float) -> None:
            with _with_config(self, retry_interval=0.0):
                f(self, sub, now)
        return run_timers
    return _wrap(ShardCore, "_run_timers", make)


def one_push_too_many() -> contextlib.AbstractContextManager[Any]:
    """G4: a message gets 2 + retry_count pushes."""
    def make(f: Any) -> Any:
        def run_timers(self: ShardCore, sub: Subscription, now: float) -> None:
            with _with_config(self, retry_count=self.config.subscriber.retry_count + 1):
                f(self, sub, now)
        return run_timers
    return _wrap(ShardCore, "_run_timers", make)


def reverse_first_deliveries() -> contextlib.AbstractContextManager[Any]:
    """G1: a batch of first deliveries goes out in reverse offset order."""
    def make(f: Any) -> Any:
        def push_new(self: ShardCore, sub: Subscription, now: float) -> None:
            session = self.sessions.get(sub.session[0]) if sub.session else None
            before = len(session.out) if session is not None else 0
            f(self, sub, now)
            if session is not None and len(session.out) > before:
                frame = session.out[-1]
                if frame[0] == protocol.DELIVER:  # reversed copies: columns may be shared
                    _, _, _, _, offsets, ids, payloads, times = frame
                    frame[4:8] = [list(protocol.offsets_of(offsets, len(ids)))[::-1],
                                  ids[::-1], payloads[::-1],
                                  protocol.time_runs(list(protocol.times_of(times))[::-1])]
        return push_new
    return _wrap(ShardCore, "_push_new", make)


def ignore_max_in_flight() -> contextlib.AbstractContextManager[Any]:
    """G1: the window is ignored; only credit limits pushes."""
    def make(f: Any) -> Any:
        def attach(self: Subscription, session: tuple[int, int], credit: int,
                   max_in_flight: int, now: float) -> None:
            f(self, session, credit, 1 << 20, now)
        return attach
    return _wrap(Subscription, "attach", make)


def keep_inactive_forever() -> contextlib.AbstractContextManager[Any]:
    """G6: inactive subscriptions are never deleted."""
    return _wrap(ShardCore, "_cleanup_subscribers", lambda f: lambda self, now: None)


def delete_inactive_at_once() -> contextlib.AbstractContextManager[Any]:
    """G6: inactive subscriptions are deleted without waiting inactive_time."""
    def make(f: Any) -> Any:
        def cleanup(self: ShardCore, now: float) -> None:
            with _with_config(self, inactive_time=0.0):
                f(self, now)
        return cleanup
    return _wrap(ShardCore, "_cleanup_subscribers", make)


def drop_attached_ephemeral() -> contextlib.AbstractContextManager[Any]:
    """G6: subscriber cleanup also deletes ephemeral subscriptions idle for a second,
    their session still attached and told nothing (G5 then lets their messages go)."""
    def make(f: Any) -> Any:
        def cleanup(self: ShardCore, now: float) -> None:
            f(self, now)
            for topic in list(self.topics.values()):
                for sub in list(topic.subs.values()):
                    if sub.ephemeral and sub.active and now - sub.last_activity >= 1.0:
                        self._delete_subscription(sub)
        return cleanup
    return _wrap(ShardCore, "_cleanup_subscribers", make)


def reuse_generation() -> contextlib.AbstractContextManager[Any]:
    """G7: a restarted shard keeps generation 1, so clients mix two logs' offsets."""
    def make(f: Any) -> Any:
        def init(self: ShardCore, *args: Any, **kwargs: Any) -> None:
            kwargs["generation"] = 1
            f(self, *args, **kwargs)
        return init
    return _wrap(ShardCore, "__init__", make)


def impatient_heartbeat() -> contextlib.AbstractContextManager[Any]:
    """G6: sessions silent for 0.4 heartbeat periods are dropped (clients ping every 0.5)."""
    def make(f: Any) -> Any:
        def check_sessions(self: ShardCore, now: float) -> None:
            with _with_config(self, heartbeat=self.config.subscriber.heartbeat / 5):
                f(self, now)
        return check_sessions
    return _wrap(ShardCore, "_check_sessions", make)


def start_at_oldest() -> contextlib.AbstractContextManager[Any]:
    """G6: a new subscription without start options starts at the oldest held message."""
    original = ShardCore._handlers[protocol.SUBSCRIBE]

    def subscribe(self: ShardCore, session: Any, frame: list[Any], now: float) -> None:
        opts = frame[3] if len(frame) > 3 and isinstance(frame[3], dict) else None
        if opts is not None and opts.get("from_offset") is None:
            frame = [*frame[:3], {**opts, "read_old": True}, *frame[4:]]
        original(self, session, frame, now)
    # frames are dispatched through this table, built when the class was
    return mock.patch.dict(ShardCore._handlers, {protocol.SUBSCRIBE: subscribe})


def retire_restarts_offsets() -> contextlib.AbstractContextManager[Any]:
    """G1: a topic forgotten while empty starts again at offset 0 when used again."""
    def make(f: Any) -> Any:
        def retire(self: ShardCore, topic: Any) -> None:
            del self.topics[topic.name]  # and no next offset kept
        return retire
    return _wrap(ShardCore, "_retire", make)


def fetch_skips_message() -> contextlib.AbstractContextManager[Any]:
    """G1: a FETCHED page of two or more messages leaves out its second one, so every
    later message of the page is reported one offset early."""
    original = ShardCore._handlers[protocol.FETCH]

    def fetch(self: ShardCore, session: Any, frame: list[Any], now: float) -> None:
        before = len(session.out)
        original(self, session, frame, now)
        if len(session.out) > before and session.out[-1][0] == protocol.FETCHED:
            reply = session.out[-1]
            ids, payloads, times = reply[4:7]
            if len(ids) >= 2:
                kept = list(protocol.times_of(times))
                del kept[1]
                reply[4:7] = [ids[:1] + ids[2:], list(payloads[:1]) + list(payloads[2:]),
                              protocol.time_runs(kept)]
    return mock.patch.dict(ShardCore._handlers, {protocol.FETCH: fetch})


def commit_moves_back() -> contextlib.AbstractContextManager[Any]:
    """G6: a COMMIT sets the cursor to its offset even when that is below the cursor."""
    def commit(self: Subscription, offset: int) -> None:
        self.cursor = offset
        self.acked = {o for o in self.acked if o > offset}
    return mock.patch.object(Subscription, "commit", commit)


def cleanup_ignores_pull_cursors() -> contextlib.AbstractContextManager[Any]:
    """G5: message cleanup looks only at push subscriptions' cursors, so it deletes what
    a pull subscription has not committed past."""
    def make(f: Any) -> Any:
        def cleanup(self: ShardCore, now: float) -> bool:
            kept = {name: topic.subs for name, topic in self.topics.items()}
            for topic in self.topics.values():
                topic.subs = {k: sub for k, sub in topic.subs.items() if sub.mode != "pull"}
            try:
                done: bool = f(self, now)
            finally:
                for name, subs in kept.items():
                    if name in self.topics:
                        self.topics[name].subs = subs
            return done
        return cleanup
    return _wrap(ShardCore, "_cleanup_messages", make)


def _pull_sub_named(core: ShardCore, frame: list[Any], at: int) -> Subscription | None:
    """The existing pull subscription the options map at ``frame[at]`` names, if any."""
    opts = frame[at] if len(frame) > at and isinstance(frame[at], dict) else {}
    topic = core.topics.get(opts.get("topic"))
    sub = topic.subs.get(opts.get("name")) if topic is not None else None
    return sub if sub is not None and sub.mode == "pull" else None


def resume_forgets_commit() -> contextlib.AbstractContextManager[Any]:
    """G6: a pull SUBSCRIBE that resumes a subscription puts its cursor back to where
    the subscription started, forgetting every COMMIT."""
    original = ShardCore._handlers[protocol.SUBSCRIBE]

    def subscribe(self: ShardCore, session: Any, frame: list[Any], now: float) -> None:
        sub = _pull_sub_named(self, frame, 3)
        if sub is not None:
            sub.cursor = sub.start_offset
        original(self, session, frame, now)
    return mock.patch.dict(ShardCore._handlers, {protocol.SUBSCRIBE: subscribe})


def fetch_keeps_nothing_alive() -> contextlib.AbstractContextManager[Any]:
    """G6: a FETCH does not count as activity, so a pull subscription read but not
    committed to goes inactive and is deleted under its reader."""
    original = ShardCore._handlers[protocol.FETCH]

    def fetch(self: ShardCore, session: Any, frame: list[Any], now: float) -> None:
        sub = _pull_sub_named(self, frame, 2)
        kept = (sub.active, sub.last_activity, sub.inactive_since) if sub is not None else None
        original(self, session, frame, now)
        if sub is not None and kept is not None:
            sub.active, sub.last_activity, sub.inactive_since = kept
    return mock.patch.dict(ShardCore._handlers, {protocol.FETCH: fetch})


def repush_reversed() -> contextlib.AbstractContextManager[Any]:
    """G1: re-pushes due together go out in reverse offset order (first pushes keep
    theirs, so only a rule on re-push order sees it)."""
    def make(f: Any) -> Any:
        def redeliver(self: ShardCore, sub: Subscription, due: list[tuple[float, int, int]]) -> None:
            session = self.sessions.get(sub.session[0]) if sub.session else None
            before = len(session.out) if session is not None else 0
            f(self, sub, due)
            if session is None:
                return
            for frame in session.out[before:]:
                if frame[0] == protocol.DELIVER and len(frame[5]) > 1:
                    _, _, _, _, offsets, ids, payloads, times = frame
                    frame[4:8] = [list(protocol.offsets_of(offsets, len(ids)))[::-1],
                                  ids[::-1], payloads[::-1],
                                  protocol.time_runs(list(protocol.times_of(times))[::-1])]
        return redeliver
    return _wrap(ShardCore, "_redeliver", make)


def generation_from_index() -> contextlib.AbstractContextManager[Any]:
    """G7: the shard's start path draws its generation from a generator seeded by the
    shard index, so a restarted shard comes back with the generation it had."""
    def draw(host: Any) -> int:
        return 1 + sum(map(ord, str(getattr(host, "name", ""))))
    return mock.patch.object(shard_server, "draw_generation", draw)


def ack_moves_cursor_early() -> contextlib.AbstractContextManager[Any]:
    """G6: an ack of the offset just above the cursor moves the cursor past both (an
    off-by-one in "is this the cursor?"), though the cursor's own message is unacked:
    it stays in flight, so nothing a client sees changes until cleanup or a resume."""
    def ack(self: Subscription, offset: int) -> bool:
        if self.in_flight.pop(offset, None) is None:
            return False
        if offset - self.cursor <= 1:
            cursor = offset + 1
            while cursor in self.acked:
                self.acked.remove(cursor)
                cursor += 1
            self.cursor = cursor
        else:
            self.acked.add(offset)
        return True
    return mock.patch.object(Subscription, "ack", ack)


def commit_off_by_one() -> contextlib.AbstractContextManager[Any]:
    """G6: a COMMIT of offset n moves a pull cursor to n + 1 (taking n for the last
    offset read rather than the next to read), so each commit skips a message."""
    def make(f: Any) -> Any:
        def commit(self: Subscription, offset: int) -> None:
            f(self, offset + 1 if offset > self.cursor else offset)
        return commit
    return _wrap(Subscription, "commit", make)


def new_ids_on_retry() -> contextlib.AbstractContextManager[Any]:
    """G3: the client draws a message's id each time it sends it, not once per call, so a
    retry after a lost reply stores the message again under another id."""
    def make(f: Any) -> Any:
        def publish_failed(self: Dispatch, part: PublishPart, exc: Any, now: float) -> bool:
            batch = part.batch
            for i in range(part.lo, part.hi):
                if _client_chosen(batch.ids[i]):
                    batch.ids[i] = f"{self.rng.getrandbits(128):032x}"
            again: bool = f(self, part, exc, now)
            return again
        return publish_failed
    return _wrap(Dispatch, "_publish_failed", make)


def _client_chosen(message_id: str) -> bool:
    return len(message_id) == 32 and all(c in "0123456789abcdef" for c in message_id)


def inactive_holds_nothing() -> contextlib.AbstractContextManager[Any]:
    """G5: the subscriber cleanup pass also drops expired messages of topics whose
    subscriptions are all inactive (as if an inactive subscription held nothing),
    through a path that reports no trim."""
    def make(f: Any) -> Any:
        def cleanup(self: ShardCore, now: float) -> None:
            f(self, now)
            for topic in self.topics.values():
                idle = topic.subs and not any(sub.active for sub in topic.subs.values())
                if idle and topic.log.trim(topic.log.next_offset, now - self.config.message.ttl):
                    self._recount(topic)
        return cleanup
    return _wrap(ShardCore, "_cleanup_subscribers", make)


def acked_freed_at_once() -> contextlib.AbstractContextManager[Any]:
    """G5: the subscriber cleanup pass frees messages every subscription acked without
    waiting for their ttl (to save memory early), through a path that reports no trim."""
    def make(f: Any) -> Any:
        def cleanup(self: ShardCore, now: float) -> None:
            f(self, now)
            for topic in self.topics.values():
                if topic.subs:
                    below = min(sub.cursor for sub in topic.subs.values())
                    if topic.log.trim(below, now):
                        self._recount(topic)
        return cleanup
    return _wrap(ShardCore, "_cleanup_subscribers", make)


def full_before_dedup() -> contextlib.AbstractContextManager[Any]:
    """G3: the TopicFull check runs before the dedup check, so a retried publish whose
    original is stored gets TopicFull instead of its original offset when the topic
    is at its limit."""
    def make(f: Any) -> Any:
        def publish_slow(self: ShardCore, topic: Any, ids: list[Any], payloads: list[Any],
                         counts: dict[str, int], now: float) -> list[Any]:
            held = topic.held_bytes(now)
            result: list[Any] = f(self, topic, ids, payloads, counts, now)
            offsets, duplicates, refused = result
            if not duplicates:
                return result
            kept = []
            for i in duplicates:
                if held + len(payloads[i]) + 2 * len(ids[i]) > self.config.topic.max_bytes:
                    offsets[i] = protocol.REFUSED
                    refused.append([i, errors.TopicFull.code, "topic is full"])
                else:
                    kept.append(i)
            refused.sort()
            return [offsets, kept, refused]
        return publish_slow
    return _wrap(ShardCore, "_publish_slow", make)


def bad_id_fails_frame() -> contextlib.AbstractContextManager[Any]:
    """G8: the whole PUBLISH frame is checked for valid ids before anything is stored, so
    one bad id refuses every item of the frame, the valid ones too."""
    original = ShardCore._handlers[protocol.PUBLISH]

    def publish(self: ShardCore, session: Any, frame: list[Any], now: float) -> None:
        groups = frame[2] if len(frame) > 2 and type(frame[2]) is list else []
        for group in groups:
            for message_id in group[1] if type(group) is list and len(group) == 3 else []:
                protocol.check_message_id(message_id)
        original(self, session, frame, now)
    return mock.patch.dict(ShardCore._handlers, {protocol.PUBLISH: publish})


def unknown_kind_closes() -> contextlib.AbstractContextManager[Any]:
    """G8: a frame of an unknown kind is answered, then its connection closed, as if it
    were framing corruption."""
    def make(f: Any) -> Any:
        def handle(self: ShardCore, conn: int, frame: list[Any], now: float) -> None:
            f(self, conn, frame, now)
            session = self.sessions.get(conn)
            if session is not None and isinstance(frame, list) and frame \
                    and frame[0] not in ShardCore._handlers:
                session.close = True
        return handle
    return _wrap(ShardCore, "_handle", make)


def retried_acks_at_batch_start() -> contextlib.AbstractContextManager[Any]:
    """G2 (client): the offsets of a retried piece of a batch (items split off after a
    Busy refusal) are written at the batch's start instead of at the piece's place, so
    the call returns acks that name other messages' offsets."""
    def make(f: Any) -> Any:
        def on_published(self: Dispatch, conn: Any, layout: list[list[PublishPart]],
                         frame: list[Any], error: Any, now: float) -> None:
            saved = [(part, list(part.batch.offsets[part.lo:part.hi]))
                     for parts in layout for part in parts if part.lo > 0]
            f(self, conn, layout, frame, error, now)
            for part, before in saved:
                batch, n = part.batch, part.hi - part.lo
                got = batch.offsets[part.lo:part.hi]
                batch.offsets[part.lo:part.hi] = before
                batch.offsets[0:n] = got
        return on_published
    return _wrap(Dispatch, "_on_published", make)


PLANTED: dict[str, Callable[[], contextlib.AbstractContextManager[Any]]] = {
    "skip-dedup": skip_dedup,
    "duplicate-wrong-offset": duplicate_wrong_offset,
    "delete-on-ttl-alone": delete_on_ttl_alone,
    "cursor-before-ack": cursor_before_ack,
    "ack-ignored": ack_ignored,
    "redeliver-whole-window": redeliver_whole_window,
    "no-retry-interval": no_retry_interval,
    "one-push-too-many": one_push_too_many,
    "reverse-first-deliveries": reverse_first_deliveries,
    "ignore-max-in-flight": ignore_max_in_flight,
    "keep-inactive-forever": keep_inactive_forever,
    "delete-inactive-at-once": delete_inactive_at_once,
    "drop-attached-ephemeral": drop_attached_ephemeral,
    "reuse-generation": reuse_generation,
    "impatient-heartbeat": impatient_heartbeat,
    "start-at-oldest": start_at_oldest,
    "retire-restarts-offsets": retire_restarts_offsets,
    "fetch-skips-message": fetch_skips_message,
    "commit-moves-back": commit_moves_back,
    "cleanup-ignores-pull-cursors": cleanup_ignores_pull_cursors,
    "resume-forgets-commit": resume_forgets_commit,
    "fetch-keeps-nothing-alive": fetch_keeps_nothing_alive,
    "repush-reversed": repush_reversed,
    "generation-from-index": generation_from_index,
    "ack-moves-cursor-early": ack_moves_cursor_early,
    "commit-off-by-one": commit_off_by_one,
    "new-ids-on-retry": new_ids_on_retry,
    "inactive-holds-nothing": inactive_holds_nothing,
    "acked-freed-at-once": acked_freed_at_once,
    "full-before-dedup": full_before_dedup,
    "bad-id-fails-frame": bad_id_fails_frame,
    "unknown-kind-closes": unknown_kind_closes,
    "retried-acks-at-batch-start": retried_acks_at_batch_start,
}

# The scenario that exercises each bug's code path most (default otherwise).
SCENARIO = {"skip-dedup": "dedup", "duplicate-wrong-offset": "dedup",
            "keep-inactive-forever": "cleanup", "delete-inactive-at-once": "cleanup",
            "retire-restarts-offsets": "topics", "cleanup-ignores-pull-cursors": "cleanup",
            "new-ids-on-retry": "dedup", "full-before-dedup": "backpressure",
            "retried-acks-at-batch-start": "backpressure"}
