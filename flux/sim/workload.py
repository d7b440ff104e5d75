"""What simulated clients do: producers that retry with the same id, subscribers
that ack, ack slowly, never ack, disconnect, unsubscribe and resubscribe, and pull
readers that FETCH pages and COMMIT their cursor now, later or not at all.

Each actor is a real ``flux.client.trio`` client on its own tapped host; its
choices come from a ``random.Random`` of its own, so runs replay. Scenarios
(which actors, which config, which faults) live in :mod:`flux.sim.scenarios`.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import trio

from flux import errors
from flux.client.trio import Client, connect
from flux.client.types import PublishAck
from flux.hashing import dead_letter_topic
from flux.sim import history as h
from flux.sim.faults import FaultMix
from flux.sim.simhost import derive_seed
from flux.sim.tap import TappedHost
from flux.sim.vandal import Vandal
from flux.sim.world import World

ROUTER_URL = "flux://127.0.0.1:7070"
ROUTER_PORT = 7070

# Errors after which a subscriber subscribes again. Not StorageUnavailable: a push
# subscription ended with it (its topic's log is recovered after damage was read back,
# G9) is resumed by the client itself (PROTOCOL.md §6.8), so the user never sees it; a
# subscriber that does stops there, as a user's loop would, and the liveness rules
# notice the subscription that silently stopped.
ENDED = (errors.SubscriptionInactive, errors.SubscriptionTakenOver, errors.TopicReset,
         errors.NotDelivered, errors.UnknownSubscription, errors.OffsetOutOfRange,
         errors.InvalidRequest, errors.RetryDeadlineExceeded, errors.ConnectionLost,
         errors.RequestTimeout)

# Subscriber behaviours; "live" ones must have everything delivered (pullers: read and
# committed) after the heal.
BEHAVIOURS = ("ack", "slow", "never", "flaky", "unsub", "strict", "window", "reader", "takeover",
              "ephemeral", "raise", "puller", "stall", "meddle", "worker")

# Errors after which a pull reader subscribes again (its subscription is gone, or of
# another generation) before it reads on.
PULL_ENDED = (errors.TopicReset, errors.UnknownSubscription, errors.OffsetOutOfRange)


class _GaveUp(Exception):
    """A subscriber stops: its push subscription ended with a retryable error."""


@dataclass(frozen=True)
class ProducerSpec:
    name: str
    topics: tuple[str, ...]
    count: int
    gap: float                 # mean seconds between publishes
    batch: int = 1             # most messages per publish_many
    auto_ids: bool = False     # let the client choose the ids (payloads name the call)
    delay: float = 0.0         # most seconds a call is delayed (G12; half the calls are)
    keyed: bool = False        # messages carry a key (of 4) and headers


@dataclass(frozen=True)
class SubscriberSpec:
    name: str                  # its host
    topic: str
    sub_name: str | None       # None: ephemeral
    behaviour: str
    live: bool
    read_old: bool = False
    from_offset: int | None = None
    max_in_flight: int | None = None
    prefetch: int | None = None
    churn: float = 0.0         # mean seconds between disconnects/unsubscribes (0: never)
    on_reset: str = "earliest"
    page: int = 0              # puller: most messages per FETCH
    commit_every: int = 1      # puller: pages read between two COMMITs
    shared: bool = False       # a member of the shared subscription ``sub_name`` (G10)
    key_ordered: bool = False
    start_after: float = 0.0   # when it first subscribes (late: kept delayed messages wait)
    from_held: bool = False    # draw from_offset from what its topic holds then (FETCH)

    @property
    def subscriber(self) -> str:
        """The id the history uses for it (the tap's ``host/name``)."""
        return f"{self.name}/{self.sub_name if self.sub_name is not None else '~'}"


@dataclass(frozen=True)
class Workload:
    """A whole run's set-up, drawn from the seed by a scenario."""

    scenario: str
    config: dict[str, Any]
    topics: tuple[str, ...]
    producers: tuple[ProducerSpec, ...]
    subscribers: tuple[SubscriberSpec, ...]
    mix: FaultMix
    warmup: float = 1.0
    fault_phase: float = 30.0
    liveness_phase: float = 30.0
    request_timeout: float = 2.0
    retry_deadline: float = 10.0
    give_up_after: float = 20.0  # a producer's own retries of one id (with retry_deadline < dedup)
    vandals: tuple[str, ...] = ()  # clients that send bad input on purpose (G8)
    auditors: tuple[str, ...] = ()  # clients that read every topic back from its oldest
    # clients that read the dead-letter topics of the subscribers' subscriptions (G11)
    dead_letter_readers: tuple[str, ...] = ()
    # with auth on (G13): each client's credential (keyword arguments of connect), by
    # client name; "*" for any client not named. Intruders try what their user may not.
    logins: dict[str, dict[str, str]] = field(default_factory=dict)
    intruders: tuple[str, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def clients(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.producers) + tuple(s.name for s in self.subscribers)


class Actors:
    """Runs a workload's clients in ``world``; ``healed`` switches them to liveness mode."""

    def __init__(self, world: World, workload: Workload, seed: int) -> None:
        self.world = world
        self.w = workload
        self.seed = seed
        self.healed = trio.Event()
        self.publishing_over = trio.Event()
        sub = workload.config.get("subscriber", {})
        self.timeout = float(sub.get("timeout", 30.0))
        self.inactive_time = float(sub.get("inactive_time", 300.0))
        self.heartbeat = float(sub.get("heartbeat", 5.0))

    def login(self, client: str) -> dict[str, str]:
        """The credential ``client`` connects with (none without auth)."""
        logins = self.w.logins
        return logins.get(client, logins.get("*", {}))

    def rng(self, name: str) -> random.Random:
        return random.Random(derive_seed(self.seed, "actor", name))

    @asynccontextmanager
    async def _client(self, host: TappedHost) -> AsyncIterator[Client]:
        try:
            login = self.login(host.name)
            async with connect(ROUTER_URL, host=host, request_timeout=self.w.request_timeout,
                               retry_deadline=self.w.retry_deadline, token=login.get("token"),
                               user=login.get("user"), password=login.get("password")) as client:
                yield client
        finally:
            host.drop_connections()

    # -- producers ---------------------------------------------------------------------

    async def producer(self, spec: ProducerSpec) -> None:
        rng = self.rng(spec.name)
        host = self.world.client_host(spec.name)
        n = 0
        calls = iter(range(1 << 62))
        while n < spec.count and not self.publishing_over.is_set():
            try:
                async with self._client(host) as client:
                    while n < spec.count and not self.publishing_over.is_set():
                        await trio.sleep(rng.expovariate(1.0 / spec.gap))
                        size = min(rng.randint(1, spec.batch), spec.count - n)
                        ids = [f"{spec.name}-{n + i}" for i in range(size)]
                        await self._publish(client, rng, spec, rng.choice(spec.topics), ids,
                                            calls)
                        n += len(ids)
            except (errors.FluxError, OSError):
                await trio.sleep(rng.uniform(0.1, 1.0))

    async def _publish(self, client: Client, rng: random.Random, spec: ProducerSpec,
                       topic: str, ids: list[str], calls: Iterator[int]) -> None:
        """Publish until acked, calling again with the same ids (or, when the client
        chooses them, the same messages under new ones); give up before dedup_window.
        Each call is recorded: the user-level operation and what it returned."""
        give_up = trio.current_time() + self.w.give_up_after
        # every call of one operation asks for the same delay (G12) and keys
        delay = round(rng.uniform(0.05, spec.delay), 3) \
            if spec.delay > 0 and rng.random() < 0.5 else None
        keys = [f"k{n % 4}" for n in range(len(ids))] if spec.keyed else None
        headers = [{"from": spec.name, "n": str(n)} for n in range(len(ids))] \
            if spec.keyed else None
        while True:
            call = next(calls)
            # with client-chosen ids a payload names its call, so copies a call stored
            # under ids the history cannot link are still seen to be one call's
            payloads = [f"{spec.name}.{call}.{i}".encode() for i in range(len(ids))] \
                if spec.auto_ids else [i.encode() for i in ids]
            given = None if spec.auto_ids else tuple(ids)
            self.world.record(h.PublishCalled(trio.current_time(), spec.name, call, topic,
                                              tuple(p.decode() for p in payloads), given))
            try:
                if len(ids) == 1:
                    acks: Sequence[PublishAck] = [await client.publish(
                        topic, payloads[0], id=None if given is None else given[0],
                        key=keys[0] if keys else None, headers=headers[0] if headers else None,
                        delay=delay)]
                else:
                    acks = await client.publish_many(topic, payloads, ids=given, keys=keys,
                                                     headers=headers, delay=delay)
                self.world.record(h.PublishReturned(
                    trio.current_time(), spec.name, call, topic, tuple(a.id for a in acks),
                    tuple(a.offset for a in acks), tuple(a.generation for a in acks),
                    tuple(a.duplicate for a in acks)))
                return
            except errors.NotAuthorized as exc:  # never retried: the same user stays refused
                self.world.record(h.PublishReturned(trio.current_time(), spec.name, call,
                                                    topic, (), (), (), (), type(exc).__name__))
                return
            except (errors.TopicFull, errors.Busy, errors.RetryDeadlineExceeded,
                    errors.ConnectionLost, errors.RequestTimeout, errors.ShuttingDown,
                    errors.WrongShard) as exc:
                self.world.record(h.PublishReturned(trio.current_time(), spec.name, call,
                                                    topic, (), (), (), (), type(exc).__name__))
                if trio.current_time() + self.w.retry_deadline > give_up:
                    return
                await trio.sleep(rng.uniform(0.05, 0.5))

    async def vandal(self, name: str) -> None:
        """Bad input on purpose until the heal (:mod:`flux.sim.vandal`)."""
        host = self.world.client_host(name)
        await Vandal(host, self.w.topics, self.rng(name), ROUTER_PORT,
                     self.world.record, self.login(name)).run(self.healed)

    async def intruder(self, name: str) -> None:
        """Until the heal, try to publish, subscribe, fetch and commit on topics its
        user may and may not use (G13), recording each outcome."""
        rng = self.rng(name)
        host = self.world.client_host(name)
        topics = self.w.topics + INTRUDER_TOPICS
        serial = 0
        while not self.healed.is_set():
            with contextlib.suppress(errors.FluxError, OSError):
                async with self._client(host) as client:
                    while not self.healed.is_set():
                        serial += 1
                        operation = rng.choice(("publish", "subscribe", "fetch", "commit"))
                        topic = rng.choice(topics)
                        outcome = await _try(client, operation, topic, f"{name}-{serial}")
                        self.world.record(h.AuthChecked(trio.current_time(), name, operation,
                                                        topic, outcome))
                        await trio.sleep(rng.uniform(0.05, 0.5))
            with trio.move_on_after(0.5):
                await self.healed.wait()

    async def auditor(self, name: str) -> None:
        """Until the heal, read every topic back from its oldest held offset without a
        subscription (a replay tool), so whatever a recovery gave back is read again."""
        rng = self.rng(name)
        host = self.world.client_host(name)
        while not self.healed.is_set():
            with contextlib.suppress(errors.FluxError):
                async with self._client(host) as client:
                    while not self.healed.is_set():
                        for topic in self.w.topics:
                            head = await client.fetch(topic, 0, 0)
                            await client.fetch(topic, head.oldest, 1000)
                        with trio.move_on_after(rng.uniform(0.2, 1.0)):
                            await self.healed.wait()
            with trio.move_on_after(0.5):
                await self.healed.wait()

    async def dead_letter_reader(self, name: str) -> None:
        """Read every dead-letter topic of the workload's named push subscriptions whole,
        again and again until the end (G11: what was dead-lettered, and its record)."""
        rng = self.rng(name)
        host = self.world.client_host(name)
        names = sorted({dead_letter_topic(s.topic, s.sub_name) for s in self.w.subscribers
                        if s.sub_name is not None and s.behaviour != "puller"})
        while True:
            with contextlib.suppress(errors.FluxError, OSError):
                async with self._client(host) as client:
                    while True:
                        for dlq in names:
                            await client.fetch(dlq, 0, 1000)
                        await trio.sleep(rng.uniform(0.5, 1.5))
            await trio.sleep(0.5)

    async def canary(self, topics: tuple[str, ...]) -> None:
        """After the heal: one publish per topic that must be acked (liveness)."""
        host = self.world.client_host("canary")
        pending = list(topics)
        while pending:
            try:
                async with self._client(host) as client:
                    while pending:
                        topic = pending[0]
                        await client.publish(topic, b"canary", id=f"canary-{topic}")
                        pending.pop(0)
            except (errors.FluxError, OSError):
                await trio.sleep(0.5)

    # -- subscribers -------------------------------------------------------------------

    async def subscriber(self, spec: SubscriberSpec) -> None:
        if spec.behaviour == "puller":
            await self.puller(spec)
            return
        rng = self.rng(spec.name)
        host = self.world.client_host(spec.name)
        if spec.start_after:  # (no checkpoint otherwise: every other run stays as it was)
            await trio.sleep_until(spec.start_after)
        while not self._leaving(spec):
            with trio.CancelScope() as connection:
                try:
                    async with self._client(host) as client:
                        await self._subscribe_loop(client, spec, rng, connection)
                except _GaveUp:
                    return  # the client gave up a subscription it should resume (see ENDED)
                except (errors.FluxError, OSError):
                    pass
            # disconnected (on purpose or not): come back after a while
            await trio.sleep(rng.uniform(0.05, 1.0) if self.healed.is_set()
                             else rng.uniform(0.1, 3.0))

    async def _subscribe_loop(self, client: Client, spec: SubscriberSpec, rng: random.Random,
                              connection: trio.CancelScope) -> None:
        while not self._leaving(spec):
            churn = self._next_churn(spec, rng)
            try:
                from_offset = await self._from_offset(client, spec, rng)
                async with client.subscribe(
                        spec.topic, name=spec.sub_name, read_old=spec.read_old,
                        from_offset=from_offset, max_in_flight=spec.max_in_flight,
                        prefetch=spec.prefetch, on_reset=spec.on_reset, shared=spec.shared,
                        key_ordered=spec.key_ordered) as sub:
                    ended = await self._consume(sub, spec, rng, churn)
                    if isinstance(ended, errors.StorageUnavailable):
                        raise _GaveUp(ended)
                    if ended is not None:
                        raise ended
                    if spec.behaviour in ("flaky", "takeover") and not self.healed.is_set():
                        connection.cancel()  # the client process "dies": no unsubscribe
                        await trio.sleep_forever()
                # unsubscribed (churn): stay away for a while
                if not self.healed.is_set():
                    await trio.sleep(rng.uniform(0.0, 1.5 * self.inactive_time))
            except ENDED:
                await trio.sleep(rng.uniform(0.05, 1.0))

    @staticmethod
    async def _from_offset(client: Client, spec: SubscriberSpec,
                           rng: random.Random) -> int | None:
        """The from_offset a SUBSCRIBE asks for: the spec's, or (``from_held``) one drawn
        between the oldest message its topic holds now and its next offset, so that it
        may fall between a kept delayed message and the oldest in line (G12). Drawn
        anew for each SUBSCRIBE: it applies only to the one that makes the subscription."""
        if not spec.from_held:
            return spec.from_offset
        head = await client.fetch(spec.topic, 0, 0)
        return rng.randint(head.oldest, head.next)

    async def _consume(self, sub: Any, spec: SubscriberSpec, rng: random.Random,
                       churn: float) -> errors.FluxError | None:
        """Take messages until ``churn``; returns the error that ended the subscription."""
        async with trio.open_nursery() as acks:
            try:
                with trio.move_on_at(churn) as scope:
                    if not spec.live:
                        acks.start_soon(_cancel_when, self.healed, scope)
                    async for msg in sub:
                        self.world.record(h.Consumed(
                            trio.current_time(), spec.subscriber, msg.topic, msg.generation,
                            msg.offset, msg.id, msg.attempt))
                        await self._handle(msg, spec, rng, acks)
            except (*ENDED, errors.StorageUnavailable) as exc:
                return exc
            finally:
                acks.cancel_scope.cancel()
        return None

    def _leaving(self, spec: SubscriberSpec) -> bool:
        """Subscribers that are not live leave at the heal (so their subscriptions, which
        hold unacked messages, are cleaned up and topics drain)."""
        return not spec.live and self.healed.is_set()

    def _next_churn(self, spec: SubscriberSpec, rng: random.Random) -> float:
        if not spec.churn or self.healed.is_set():
            return float("inf")
        return trio.current_time() + rng.expovariate(1.0 / spec.churn)

    async def _handle(self, msg: Any, spec: SubscriberSpec, rng: random.Random,
                      acks: trio.Nursery) -> None:
        behaviour = spec.behaviour
        if behaviour == "never":
            return
        if behaviour == "slow" and not self.healed.is_set():
            acks.start_soon(_ack_later, msg, rng.uniform(0.0, 2.0 * self.timeout))
        elif behaviour == "strict" and not self.healed.is_set():
            await trio.sleep(rng.uniform(0.0, 0.3 * self.timeout))
            await msg.ack()
        elif behaviour == "stall" and not self.healed.is_set() and rng.random() < 0.2:
            # a worker stuck on a job, connected and heartbeating: its messages time out
            # and come back to it, nothing reaches it meanwhile
            await trio.sleep(rng.uniform(0.0, 3.0 * self.timeout))
            await msg.ack()
        elif behaviour == "meddle" and not self.healed.is_set() and rng.random() < 0.3:
            # acks an offset next to its own, which another member may hold (a buggy
            # worker): the shard must refuse it unless this member holds it
            _meddle(msg, msg.offset + rng.choice((-2, -1, 1, 2)))
            await msg.ack()
        elif behaviour == "worker" and not self.healed.is_set():
            await self._work(msg, rng, acks)
        else:
            await msg.ack()

    async def _work(self, msg: Any, rng: random.Random, acks: trio.Nursery) -> None:
        """A worker of a work queue (G11): acks most messages, naks some (now or after a
        delay), terms some, holds some in progress for longer than the ack timeout, and
        drops a few (they run out of pushes)."""
        roll = rng.random()
        if roll < 0.45:
            await msg.ack()
        elif roll < 0.6:
            await msg.nak(0.0)
        elif roll < 0.72:
            await msg.nak(round(rng.uniform(0.1, 1.5 * self.timeout), 3))
        elif roll < 0.82:
            await msg.term(f"bad input {msg.offset}")
        elif roll < 0.92:
            acks.start_soon(_keep_alive, msg, self.timeout, rng.uniform(1.0, 2.5))
        # else: dropped, as by a worker that died with it

    # -- pull readers ------------------------------------------------------------------

    async def puller(self, spec: SubscriberSpec) -> None:
        """A pull reader (the Spark source's path): SUBSCRIBE in pull mode, FETCH pages
        from its position, COMMIT the next offset after every page, a few pages later, or
        not at all (it reads again from the committed cursor, as after a crash), now and
        then go away (long enough, its subscription is deleted) and resume from the cursor
        the SUBSCRIBED reply reports (or an older checkpoint of its own). It keeps the
        generation it knows across reconnects, as a checkpoint would, so a shard restart
        shows as TopicReset or a reset reply. Once faults heal it commits every page."""
        rng = self.rng(spec.name)
        host = self.world.client_host(spec.name)
        state = _PullState()
        if spec.start_after:
            await trio.sleep_until(spec.start_after)
        while True:
            try:
                async with self._client(host) as client:
                    await self._pull_loop(client, spec, rng, state)
            except (errors.FluxError, OSError):
                pass
            if self.healed.is_set():
                await trio.sleep(rng.uniform(0.05, 1.0))
            elif state.left:  # went away on purpose: perhaps until it is deleted
                await self._nap(rng.uniform(0.0, 1.5 * (self.inactive_time + 2 * self.heartbeat)))
            else:
                await trio.sleep(rng.uniform(0.1, 3.0))

    async def _pull_loop(self, client: Client, spec: SubscriberSpec, rng: random.Random,
                         state: _PullState) -> None:
        assert spec.sub_name is not None
        topic, name = spec.topic, spec.sub_name
        state.left = False
        position = committed = await self._pull_subscribe(client, spec, state)
        if state.checkpoint is not None and not self.healed.is_set() and rng.random() < 0.3:
            # resume from a checkpoint of its own, older than the cursor (as a job restored
            # from an earlier checkpoint does): what lies below the cursor may be gone
            generation, offset = state.checkpoint
            if generation == state.generation and offset < position:
                position = offset
                if rng.random() < 0.5:  # and commits it again: the cursor must stay
                    await client.commit(topic, name, offset, state.generation)
        pages = 0                                  # read since the last commit
        idle = 0                                   # empty pages in a row
        leave = self._next_churn(spec, rng)
        while trio.current_time() < leave:
            healed = self.healed.is_set()
            try:
                page = await client.fetch(topic, position, spec.page, name=name,
                                          generation=state.generation)
                position = page.messages[-1].offset + 1 if page.messages \
                    else max(position, page.oldest)
                if not page.messages:
                    if position > committed:
                        committed = await client.commit(topic, name, position, state.generation)
                        pages = 0
                    # poll, backing off while nothing comes (up to 3 s: longer than two
                    # heartbeat periods in some configs, so an idle pull subscription goes
                    # inactive, keeps what it holds, and the next FETCH wakes it)
                    idle += 1
                    await trio.sleep(rng.uniform(0.5, 1.0) * min(0.2 * 2 ** idle, 3.0))
                    continue
                idle = 0
                pages += 1
                roll = rng.random()
                if not healed:
                    await trio.sleep(rng.uniform(0.0, 0.2))    # processing the page
                if not healed and roll < 0.1:
                    position, pages = committed, 0             # "crashed": read it again
                elif healed or pages >= spec.commit_every:
                    committed = await client.commit(topic, name, position, state.generation)
                    pages = 0
                    if state.generation is not None and rng.random() < 0.3:
                        state.checkpoint = (state.generation, committed)
                if not healed and 0.4 < roll < 0.6:
                    await self._replay_read(client, spec, rng, position, state)
                if not healed and roll > 0.88:
                    # a stale commit (a retried job's) must not move the cursor back
                    await client.commit(topic, name, max(0, committed - rng.randint(1, 3)),
                                        state.generation)
                elif not healed and roll > 0.85:
                    # a long stall: the subscription goes inactive, perhaps is deleted
                    await self._nap(rng.uniform(0.0, self.inactive_time + 3 * self.heartbeat))
            except PULL_ENDED:
                position = committed = await self._pull_subscribe(client, spec, state)
                pages = 0
        state.left = True

    async def _replay_read(self, client: Client, spec: SubscriberSpec, rng: random.Random,
                           position: int, state: _PullState) -> None:
        """Read back without a subscription (a replay tool's FETCH): a little behind its
        position, or from a checkpoint of its own (perhaps of a generation a restart
        ended: the shard must answer TopicReset, not read the new log)."""
        generation, offset = state.generation, max(0, position - rng.randint(1, 5))
        if state.checkpoint is not None and rng.random() < 0.7:
            generation, offset = state.checkpoint
        with contextlib.suppress(errors.TopicReset, errors.OffsetOutOfRange):
            await client.fetch(spec.topic, offset, spec.page, generation=generation)

    async def _nap(self, seconds: float) -> None:
        """Sleep, but no longer than until the heal (a live reader reads on then)."""
        with trio.move_on_after(seconds):
            await self.healed.wait()

    async def _pull_subscribe(self, client: Client, spec: SubscriberSpec,
                              state: _PullState) -> int:
        """Create or resume the pull subscription; returns the cursor to read from."""
        assert spec.sub_name is not None
        read_old, from_offset = spec.read_old, spec.from_offset
        try:
            info = await client.subscribe_pull(
                spec.topic, spec.sub_name, read_old=read_old, from_offset=from_offset,
                generation=state.generation, on_reset=spec.on_reset)
        except errors.TopicReset:
            # on_reset="raise": the reader hears of the restart and starts afresh
            state.generation = None
            info = await client.subscribe_pull(spec.topic, spec.sub_name, read_old=read_old,
                                               from_offset=from_offset)
        except errors.OffsetOutOfRange:
            # from_offset is past the end (a restart, or cleanup after it was deleted,
            # left fewer messages): read what is held instead
            info = await client.subscribe_pull(spec.topic, spec.sub_name, read_old=True,
                                               generation=state.generation,
                                               on_reset=spec.on_reset)
        state.generation = info.generation
        return info.cursor


@dataclass
class _PullState:
    """What a pull reader keeps across connections."""

    generation: int | None = None   # the generation it knows (passed on SUBSCRIBE and FETCH)
    left: bool = False              # its last connection ended on purpose
    checkpoint: tuple[int, int] | None = None   # (generation, offset) of a commit it made


# topics only intruders use (their users' rules name them), beside the workload's
INTRUDER_TOPICS = ("sandbox.box", "sandbox.locked", "sandbox.deep.box")


async def _try(client: Client, operation: str, topic: str, tag: str) -> str:
    """One attempt of an intruder: "accepted", or the class name of what refused it."""
    try:
        if operation == "publish":
            await client.publish(topic, tag.encode(), id=tag)
        elif operation == "subscribe":
            async with client.subscribe(topic, read_old=True):  # ephemeral: gone at once
                pass
        elif operation == "fetch":
            await client.fetch(topic, 0, 5)
        else:
            await client.commit(topic, "intruder", 0, None)
    except errors.FluxError as exc:
        return type(exc).__name__
    return "accepted"


async def _cancel_when(event: trio.Event, scope: trio.CancelScope) -> None:
    await event.wait()
    scope.cancel()


def _meddle(msg: Any, offset: int) -> None:
    """Queue an ack of ``offset`` on ``msg``'s session as if its user had been given it
    (a client library never does this; a buggy or hostile one might): it goes out by
    offset with the next ack."""
    session = msg._session
    if offset >= 0 and offset >= session.confirmed and offset not in session.acked:
        session.acked.add(offset)
        session.queued.append(offset)
        session.delayed.add(offset)


async def _keep_alive(msg: Any, timeout: float, work: float) -> None:
    """Work ``work`` timeouts on a message, telling the broker so every half timeout
    (in_progress), then ack it."""
    end = trio.current_time() + work * timeout
    while trio.current_time() + 0.5 * timeout < end:
        await trio.sleep(0.5 * timeout)
        await msg.in_progress()
    await trio.sleep(max(0.0, end - trio.current_time()))
    await msg.ack()


async def _ack_later(msg: Any, delay: float) -> None:
    await trio.sleep(delay)
    await msg.ack()
