"""Named scenarios: each draws a :class:`~flux.sim.workload.Workload` from a seed.

Timings are small (ttl, timeouts, cleanup passes of a second or two) so cleanup,
redelivery and inactivity happen many times in a run of a minute or two of
simulated time. Add a scenario by writing a function and listing it in ``SCENARIOS``.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import replace

from flux.auth.credentials import hash_password, token_digest
from flux.sim.faults import FaultMix
from flux.sim.workload import INTRUDER_TOPICS, ROUTER_PORT, ProducerSpec, SubscriberSpec, Workload

ALL_FAULTS = (("crash", 1.0), ("pause", 1.5), ("router", 0.7), ("partition", 1.5),
              ("stall", 1.5), ("reset", 1.0), ("slow", 0.7))


def base_config(rng: random.Random, shards: int) -> dict[str, object]:
    timeout = rng.choice((0.5, 1.0, 1.5))
    heartbeat = rng.choice((1.0, 2.0))
    return {
        "port": ROUTER_PORT, "shards": shards,
        "message": {"ttl": rng.choice((1.0, 2.0, 4.0)), "cleanup_time": rng.choice((0.5, 1.0)),
                    "dedup_window": 60.0},
        "subscriber": {"retry_count": rng.randint(1, 4), "retry_interval": rng.choice((0.25, 0.5)),
                       "timeout": timeout, "cleanup_time": rng.choice((0.5, 1.0)),
                       "inactive_time": rng.choice((2.0, 4.0, 6.0)), "heartbeat": heartbeat,
                       "max_in_flight": rng.choice((20, 100))},
        "router": {"adopt_window": rng.choice((0.5, 1.0, 2.0))},
        "shard": {"orphan_timeout": 30.0},
    }


def _topics(rng: random.Random, n: int) -> tuple[str, ...]:
    words = ("orders", "billing", "audit", "clicks", "events", "mail", "jobs", "logs")
    chosen = rng.sample(words, n)
    return tuple(f"{w}.{rng.choice(('eu', 'us', 'ap'))}" for w in chosen)


def _subscriber(rng: random.Random, i: int, topic: str, behaviour: str) -> SubscriberSpec:
    name = f"s{i}"
    spec = SubscriberSpec(name=name, topic=topic, sub_name=f"sub{i}", behaviour=behaviour,
                          live=behaviour not in ("never", "takeover", "ephemeral"))
    if behaviour in ("flaky", "unsub"):
        spec = replace(spec, churn=rng.uniform(3.0, 10.0))
    elif behaviour == "strict":
        spec = replace(spec, max_in_flight=1, prefetch=1)
    elif behaviour == "window":
        n = rng.randint(2, 8)
        spec = replace(spec, max_in_flight=n, prefetch=rng.randint(1, n))
    elif behaviour == "ephemeral":
        spec = replace(spec, sub_name=None, churn=rng.uniform(3.0, 10.0))
    elif behaviour == "raise":
        spec = replace(spec, on_reset="raise")
    elif behaviour == "reader":
        if rng.random() < 0.5:
            spec = replace(spec, read_old=True)
        else:
            spec = replace(spec, from_offset=rng.randint(0, 3))
    return spec


def _puller(rng: random.Random, i: int, topic: str) -> SubscriberSpec:
    """A pull reader: pages of 1-20 messages, a commit every 1-3 pages, either on_reset."""
    spec = SubscriberSpec(name=f"r{i}", topic=topic, sub_name=f"pull{i}", behaviour="puller",
                          live=True, churn=rng.uniform(3.0, 10.0),
                          page=rng.choice((1, 2, 5, 20)), commit_every=rng.randint(1, 3),
                          on_reset=rng.choice(("earliest", "raise")))
    start = rng.random()
    if start < 0.6:
        spec = replace(spec, read_old=True)
    elif start < 0.8:
        spec = replace(spec, from_offset=rng.randint(0, 3))
    return spec


def _with_pullers(rng: random.Random, topics: tuple[str, ...],
                  subscribers: list[SubscriberSpec]) -> tuple[SubscriberSpec, ...]:
    """Most runs get a pull reader (some two), in place of a push subscriber when they
    have more than three (so a run costs about what it did)."""
    if rng.random() < 0.75:
        pullers = [_puller(rng, k, rng.choice(topics))
                   for k in range(1 if rng.random() < 0.7 else 2)]
        plain = [i for i, s in enumerate(subscribers) if s.behaviour != "takeover"]
        drop = set(plain[3:][-len(pullers):])
        subscribers = [s for i, s in enumerate(subscribers) if i not in drop] + pullers
    return tuple(subscribers)


def default(rng: random.Random) -> Workload:
    """Every behaviour (pull readers too) and every fault kind, 1-3 shards."""
    shards = rng.randint(1, 3)
    topics = _topics(rng, rng.randint(2, 4))
    producers = tuple(ProducerSpec(f"p{i}", topics, count=rng.randint(20, 50),
                                   gap=rng.uniform(0.2, 0.8), batch=rng.choice((1, 1, 3)))
                      for i in range(rng.randint(1, 3)))
    kinds = ["ack", "slow", "flaky", "unsub", "strict", "window", "reader", "never", "ephemeral",
             "raise"]
    rng.shuffle(kinds)
    subscribers = [_subscriber(rng, i, rng.choice(topics), kind)
                   for i, kind in enumerate(kinds[:rng.randint(3, 6)])]
    if rng.random() < 0.3:
        topic, i = rng.choice(topics), len(subscribers)
        subscribers += [replace(_subscriber(rng, i + k, topic, "takeover"), sub_name=f"shared{i}",
                                churn=rng.uniform(3.0, 8.0)) for k in range(2)]
    return Workload("default", base_config(rng, shards), topics, producers,
                    _with_pullers(rng, topics, subscribers), FaultMix(ALL_FAULTS))


def no_faults(rng: random.Random) -> Workload:
    """The default workload with no faults at all: every rule must hold exactly."""
    w = default(rng)
    return replace(w, scenario="no-faults", mix=FaultMix((), count=(0, 0)))


def crashes(rng: random.Random) -> Workload:
    """Process faults only: shard crashes and pauses, router crashes (some longer than
    shard.orphan_timeout, so orphaned shards exit and the new router starts them again)."""
    w = default(rng)
    config = dict(w.config)
    config["shard"] = {"orphan_timeout": rng.choice((4.0, 8.0, 30.0))}
    return replace(w, scenario="crashes", config=config,
                   mix=FaultMix((("crash", 1.0), ("pause", 1.0), ("router", 1.0)), count=(3, 10),
                                router_down=(0.5, 12.0)))


def network(rng: random.Random) -> Workload:
    """Network faults only: partitions both ways and one way, stalls, resets, slow links."""
    w = default(rng)
    return replace(w, scenario="network",
                   mix=FaultMix((("partition", 1.0), ("stall", 1.5), ("reset", 1.0),
                                 ("slow", 0.7)), count=(4, 14)))


def strict(rng: random.Random) -> Workload:
    """Strict mode and small windows, slow acks: order and redelivery under faults."""
    w = default(rng)
    subs = tuple(_subscriber(rng, i, rng.choice(w.topics), rng.choice(("strict", "window", "slow")))
                 for i in range(rng.randint(3, 5)))
    return replace(w, scenario="strict", subscribers=subs)


def cleanup(rng: random.Random) -> Workload:
    """Tight ttl, cleanup and inactivity; subscribers that come and go (G5, G6)."""
    w = default(rng)
    config = dict(w.config)
    config["message"] = {**w.config["message"], "ttl": 0.5, "cleanup_time": 0.25}  # type: ignore[dict-item]
    config["subscriber"] = {**w.config["subscriber"],  # type: ignore[dict-item]
                            "inactive_time": rng.choice((1.0, 2.0)), "cleanup_time": 0.25}
    subs = [_subscriber(rng, i, rng.choice(w.topics),
                        rng.choice(("unsub", "flaky", "reader", "ack", "never")))
            for i in range(rng.randint(3, 6))]
    return replace(w, scenario="cleanup", config=config,
                   subscribers=_with_pullers(rng, w.topics, subs),
                   mix=FaultMix((("pause", 1.0), ("stall", 1.0), ("crash", 0.3)), count=(0, 4)))


def dedup(rng: random.Random) -> Workload:
    """A dedup window of seconds, clients that give up just inside it, lossy links (G3)."""
    w = default(rng)
    config = dict(w.config)
    config["message"] = {**w.config["message"], "dedup_window": 5.0}  # type: ignore[dict-item]
    # publishing all through the fault phase, so that faults catch publishes in flight
    producers = tuple(replace(p, batch=3, gap=w.fault_phase / p.count) for p in w.producers)
    return replace(w, scenario="dedup", config=config, producers=producers,
                   request_timeout=0.5, retry_deadline=1.5, give_up_after=3.0,
                   mix=FaultMix((("reset", 2.0), ("stall", 2.0), ("partition", 1.0),
                                 ("crash", 0.3)), count=(8, 20), partition=(0.5, 3.0),
                                stall=(0.3, 2.0), producers_only=True,
                                links=(("client<->shard", 4.0), ("router<->shard", 1.0))))


# Backpressure subscribers: mostly slow or absent acks, so topics sit at their limits
# with unacked messages held (and a retried publish meets TopicFull as a duplicate).
SLOW_ACKERS = (("slow", 3.0), ("never", 2.5), ("window", 1.5), ("strict", 1.0),
               ("flaky", 1.0), ("ack", 1.0))


def backpressure(rng: random.Random) -> Workload:
    """Topics (and shards) so small that publishes hit TopicFull until consumers ack and
    cleanup runs; subscribers that ack slowly or never hold messages at the limits."""
    w = default(rng)
    kinds, weights = zip(*SLOW_ACKERS, strict=True)
    subs = [_subscriber(rng, i, topic, rng.choices(kinds, weights)[0])
            for i, topic in enumerate(w.topics + tuple(rng.choice(w.topics)
                                                       for _ in range(rng.randint(0, 2))))]
    w = replace(w, subscribers=_with_pullers(rng, w.topics, subs))
    config = dict(w.config)
    config["topic"] = {"max_bytes": rng.choice((300, 600, 1200)), "buffer": rng.choice((2, 64))}
    # sometimes the shard's limit is the tighter one (shared by its topics)
    config["shard"] = {**w.config["shard"],  # type: ignore[dict-item]
                       "max_memory": rng.choice((1500, 3000, 1 << 30))}
    config["message"] = {**w.config["message"], "ttl": 0.5, "cleanup_time": 0.25,  # type: ignore[dict-item]
                         "dedup_window": 3.0}
    producers = tuple(replace(p, batch=4) for p in w.producers)
    # more lost replies on the clients' links than by default, so retries meet full topics
    mix = replace(w.mix, weights=(*ALL_FAULTS, ("reset", 2.0), ("stall", 1.0)),
                  links=(("client<->shard", 3.0), ("client<->router", 1.0),
                         ("router<->shard", 1.0)))
    return replace(w, scenario="backpressure", config=config, producers=producers,
                   request_timeout=0.5, retry_deadline=1.0, give_up_after=2.0, mix=mix)


def topics(rng: random.Random) -> Workload:
    """Many topics, used in bursts with quiet gaps, most with no reader: topics left
    with nothing are retired by the cleanup pass and used again (G1: their offsets go
    on; G3, G5 across it). Pull readers too, on any topic."""
    w = default(rng)
    config = dict(w.config)
    config["message"] = {"ttl": 0.5, "cleanup_time": 0.25, "dedup_window": 3.0}
    config["subscriber"] = {**w.config["subscriber"],  # type: ignore[dict-item]
                            "inactive_time": 1.0, "cleanup_time": 0.25}
    names = _topics(rng, 8)
    producers = tuple(ProducerSpec(f"p{i}", names, count=rng.randint(30, 60),
                                   gap=rng.uniform(0.4, 1.0), batch=rng.choice((1, 2, 3)))
                      for i in range(rng.randint(2, 3)))
    subs = tuple(_subscriber(rng, i, rng.choice(names[:3]),
                             rng.choice(("unsub", "ephemeral", "flaky", "ack", "reader")))
                 for i in range(rng.randint(2, 4)))
    # producers retry across the retirements (lost replies), always inside the window
    return replace(w, scenario="topics", config=config, topics=names, producers=producers,
                   subscribers=_with_pullers(rng, names, list(subs)), request_timeout=0.5,
                   retry_deadline=1.5, give_up_after=2.5,
                   mix=FaultMix((("reset", 2.0), ("stall", 2.0), ("partition", 1.0),
                                 ("crash", 0.3), ("pause", 0.5)), count=(6, 16),
                                partition=(0.5, 2.5), stall=(0.3, 2.0),
                                links=(("client<->shard", 4.0), ("router<->shard", 1.0))))


def _policy_for(rng: random.Random, topic: str) -> dict[str, object]:
    """A topics: entry that matches ``topic`` (exactly, or by a ``*`` or ``>`` pattern),
    setting some of the per-topic keys to values unlike the global ones."""
    word, region = topic.split(".")
    match = rng.choice((topic, f"{word}.*", f"{word}.>", f"*.{region}", ">"))
    keys: dict[str, dict[str, object]] = {}
    options: tuple[tuple[str, str, tuple[object, ...]], ...] = (
        ("message", "ttl", (0.25, 3.0, 8.0)),
        ("message", "dedup_window", (4.0, 8.0)),
        ("subscriber", "retry_count", (0, 1, 6)),
        ("subscriber", "retry_interval", (0.0, 0.1, 1.0)),
        ("subscriber", "timeout", (0.3, 2.5)),
        ("subscriber", "inactive_time", (0.5, 4.0, 10.0)),
    )
    for section, key, values in rng.sample(options, rng.randint(2, len(options))):
        keys.setdefault(section, {})[key] = rng.choice(values)
    return {"match": match, **keys}


def policies(rng: random.Random) -> Workload:
    """Topic policies: some topics get their own ttl, dedup window, push schedule and
    inactive_time (first match wins; the rest use the global keys); clients retry
    within the shortest dedup window (G3-G6 per topic)."""
    w = default(rng)
    config = dict(w.config)
    config["message"] = {**w.config["message"], "ttl": 0.5, "cleanup_time": 0.25}  # type: ignore[dict-item]
    config["subscriber"] = {**w.config["subscriber"],  # type: ignore[dict-item]
                            "inactive_time": rng.choice((1.0, 2.0)), "cleanup_time": 0.25}
    chosen = rng.sample(w.topics, rng.randint(1, len(w.topics)))
    entries: list[dict[str, object]] = []
    for topic in chosen:
        entry = _policy_for(rng, topic)
        if all(entry["match"] != other["match"] for other in entries):
            entries.append(entry)
    config["topics"] = entries
    subs = [_subscriber(rng, i, rng.choice(w.topics),
                        rng.choice(("ack", "slow", "never", "flaky", "unsub", "window", "reader",
                                    "ephemeral")))
            for i in range(rng.randint(3, 6))]
    return replace(w, scenario="policies", config=config,
                   subscribers=_with_pullers(rng, w.topics, subs),
                   request_timeout=0.5, retry_deadline=1.5, give_up_after=3.0,
                   mix=FaultMix((("pause", 1.0), ("stall", 1.0), ("reset", 1.0),
                                 ("partition", 0.7), ("crash", 0.3)), count=(0, 6)))


def disk(rng: random.Random) -> Workload:
    """Disk topics (G9): some or all topics keep a log on each shard machine's simulated
    disk, with fsync always, interval or never, and half the time a payload cache so
    small that reads come back from the log; shards crash (kill -9: written bytes
    survive) and come back with the same generation for those topics, every acked
    message, the dedup window and the named subscriptions' confirmed cursors."""
    w = crashes(rng)
    config = dict(w.config)
    fsync = rng.choice(("always", "always", "interval", "never"))
    interval = rng.choice((0.01, 0.05))
    config["storage"] = {"dir": "/data/flux", "fsync": fsync, "fsync_interval": interval,
                         "segment_bytes": rng.choice((4096, 16384, 1 << 20)),
                         # half the runs keep almost no payload in memory, so deliveries
                         # and FETCH read evicted groups back from the log (more than
                         # memory); the choice rides on a draw already made, so seeds
                         # keep the workloads they had
                         "cache_bytes": 256 if interval == 0.01 else 1 << 26,
                         # the other half compact slowly (16 KiB/s: a 16 KiB segment
                         # in a second, in slices of an eighth), so crashes and faults
                         # meet compactions under way; same draw, same workloads
                         "compaction_rate": 0 if interval == 0.01 else 1 << 14,
                         # disk topics keep inactive subscriptions as long as memory
                         # topics here (not 7 days), so G6's deletions are judged on them
                         "inactive_time": w.config["subscriber"]["inactive_time"]}  # type: ignore[index]
    short_window = rng.random() < 0.5  # ids leave the window in the run: segments go
    if short_window:
        config["message"] = {**w.config["message"], "dedup_window": 4.0}  # type: ignore[dict-item]
    chosen = rng.sample(w.topics, rng.randint(1, len(w.topics)))
    if len(chosen) == len(w.topics):
        config["storage"]["kind"] = "disk"  # type: ignore[index]
    else:
        config["topics"] = [{"match": topic, "storage": "disk"} for topic in chosen]
    if short_window:  # producers give up well within the window
        w = replace(w, request_timeout=0.5, retry_deadline=1.5, give_up_after=3.0)
    return replace(w, scenario="disk", config=config,
                   mix=FaultMix((("crash", 1.0), ("pause", 0.7), ("router", 0.7),
                                 ("power", 0.7), ("flip", 0.5), ("reset", 0.5)),
                                count=(3, 10), router_down=(0.5, 12.0)))


def storage_faults(rng: random.Random) -> Workload:
    """Disk topics under storage faults above all: power losses (an unsynced tail lost,
    torn or zero-filled) and flipped bits in synced records, found by the recovery
    after a crash or read back while the shard serves, between shard crashes."""
    w = disk(rng)
    config = dict(w.config)
    config["storage"] = {**w.config["storage"], "kind": "disk"}  # type: ignore[dict-item]
    config.pop("topics", None)  # every topic on disk: every fault hits some log
    return replace(w, scenario="storage-faults", config=config, auditors=("a0",),
                   mix=FaultMix((("crash", 1.0), ("power", 1.5), ("flip", 1.5),
                                 ("rot", 1.5)), count=(4, 12)))


def disk_errors(rng: random.Random) -> Workload:
    """Disk topics on disks that fail: fsync errors (the log stops, the shard exits and
    recovers; what the failed fsync did not write reads back until a power loss, which
    follows half of them), a full disk for a while (publishes refused with
    StorageUnavailable, acks and deliveries go on, writes wait for room) and slow
    fsyncs, with some crashes."""
    w = disk(rng)
    config = dict(w.config)
    config["storage"] = {**w.config["storage"], "kind": "disk"}  # type: ignore[dict-item]
    config.pop("topics", None)
    return replace(w, scenario="disk-errors", config=config, auditors=("a0",),
                   mix=FaultMix((("eio", 1.0), ("full", 1.0), ("slowdisk", 0.7),
                                 ("crash", 0.4), ("reset", 0.3)),
                                count=(3, 10), pause=(0.5, 4.0), power_after_eio=0.5))


def dead_disk(rng: random.Random) -> Workload:
    """``disk-errors`` on a dying disk: every fsync error comes with a spell in which the
    data directory takes no new file, so the failed fsync's marker cannot be made in
    the log's directory; it goes to the runtime directory, and the router's restart of
    the shard in the same boot must still cut the log there (G9 "fsyncgate")."""
    w = disk_errors(rng)
    return replace(w, scenario="dead-disk", mix=replace(w.mix, nofiles_with_eio=1.0))


def busy_disk(rng: random.Random) -> Workload:
    """``disk-errors`` on busy logs: every topic on disk with fsync always, producers
    publishing to one or two topics every 20-50 ms through most of the fault phase
    (a group's fsync takes 2-10 ms, 0.2-2 s in slow spells, so groups queue behind
    it), and fsync errors that wait for two fsyncs of a log to be under way (with
    overlapping fsyncs, ``LogWriter(sync_lanes=2)``) and fail the write-back of the
    earlier one, else the next fsync, each followed by a power loss (G9). With
    overlapping fsyncs it found that a failed group's pages can be left a hole with
    the next group's records durable after it, which recovery cannot tell from
    damage (seeds 201 and 233: a needless new generation; 229: a puller missing
    messages): the writer fsyncs one group at a time by default since."""
    w = disk_errors(rng)
    config = dict(w.config)
    config["storage"] = {**w.config["storage"], "fsync": "always"}  # type: ignore[dict-item]
    topics = w.topics[:rng.randint(1, 2)]
    producers = []
    for i in range(rng.randint(3, 4)):   # publishing for most of the fault phase
        gap = rng.uniform(0.02, 0.05)
        producers.append(ProducerSpec(f"p{i}", topics, count=int(0.7 * w.fault_phase / gap),
                                      gap=gap))
    return replace(w, scenario="busy-disk", config=config, producers=tuple(producers),
                   mix=FaultMix((("eio", 1.0), ("slowdisk", 1.0), ("crash", 0.2)),
                                count=(5, 10), power_after_eio=1.0, eio_joined=5.0))


def auth(rng: random.Random) -> Workload:
    """Auth on (G13): the workload's clients log in as "app" (a token) or "ops" (a
    password: the router's login and session tokens), and an intruder whose user may
    use only a sandbox and one topic of each kind tries everything, under every fault.
    Whatever a user may not do is refused with NotAuthorized; what it may is not."""
    w = default(rng)
    config = dict(w.config)
    intruder_publish = rng.choice(w.topics)
    intruder_subscribe = rng.choice(w.topics)
    secret = {"app": "app-" + rng.randbytes(8).hex(), "intruder": "in-" + rng.randbytes(8).hex()}
    # a cheap scrypt (N=2) with a salt from the seed: the run stays fast and replays
    password = hash_password("ops-pw", n=2, salt=rng.randbytes(16))
    config["auth"] = {"logins_per_minute": 100_000, "users": [
        {"name": "app", "token_sha256": token_digest(secret["app"]),
         "publish": {"allow": [">"], "deny": ["sandbox.>"]},
         "subscribe": {"allow": [">"], "deny": ["sandbox.>"]}},
        {"name": "ops", "password": password, "publish": [">"], "subscribe": [">"],
         "admin": [">"]},
        {"name": "intruder", "token_sha256": token_digest(secret["intruder"]),
         "publish": {"allow": ["sandbox.>", intruder_publish], "deny": ["sandbox.locked"]},
         "subscribe": ["sandbox.*", intruder_subscribe]},
    ]}
    logins: dict[str, dict[str, str]] = {"*": {"token": secret["app"], "as": "app"}}
    for p in w.producers[::2]:  # every other producer logs in with a password
        logins[p.name] = {"user": "ops", "password": "ops-pw", "as": "ops"}
    for s in w.subscribers[1::2]:
        logins[s.name] = {"user": "ops", "password": "ops-pw", "as": "ops"}
    intruders = ("x0",)
    for name in intruders:
        logins[name] = {"token": secret["intruder"], "as": "intruder"}
    assert all(t not in w.topics for t in INTRUDER_TOPICS)
    return replace(w, scenario="auth", config=config, logins=logins, intruders=intruders)


def with_client_ids(workload: Workload, rng: random.Random) -> Workload:
    """About half the producers let the client choose their ids, so the client's own id
    generation runs (and the checker knows their messages by payload). Drawn from a
    stream of its own, so every scenario's other draws stay as they were."""
    producers = tuple(replace(p, auto_ids=rng.random() < 0.5) for p in workload.producers)
    return replace(workload, producers=producers)


def with_vandals(workload: Workload, rng: random.Random) -> Workload:
    """Some runs get a client that sends the shards bad input on purpose (G8), through
    the faults (a stream of its own, as for :func:`with_client_ids`)."""
    return replace(workload, vandals=("v0",) if rng.random() < 0.4 else ())


def with_delays(workload: Workload, rng: random.Random) -> Workload:
    """In about a third of the runs, some producers delay half their publishes by up to
    a few seconds (G12) and some give every message a key and headers (a stream of its
    own, as for :func:`with_client_ids`; the other runs keep their workloads, and G1's
    offset order judges all their topics)."""
    if rng.random() >= 0.35:
        return workload
    producers = tuple(replace(p, delay=rng.choice((0.0, 1.0, 3.0)),
                              keyed=rng.random() < 0.5) for p in workload.producers)
    return replace(workload, producers=producers)


def with_late_readers(workload: Workload, rng: random.Random) -> Workload:
    """For the scenarios of delayed messages (G12): most readers (push or pull, with
    ``read_old`` or a ``from_offset``) make their subscription late, in the fault phase,
    when trims have passed pending delayed messages and keep them out of line below the
    oldest in line; some push readers draw their from_offset from what the topic holds
    then (perhaps between a kept message and the oldest in line), and some plain
    subscribers become such late readers. A stream of its own, as for
    :func:`with_client_ids`: the other draws, and the fault plans, stay as they were."""
    begin, end = workload.warmup + 2.0, workload.warmup + workload.fault_phase - 2.0
    subscribers = []
    for spec in workload.subscribers:
        roll, late = rng.random(), rng.uniform(begin, end)
        if spec.behaviour == "ack" and spec.sub_name is not None and roll < 0.4:
            spec = replace(spec, read_old=roll < 0.2, from_held=roll >= 0.2, start_after=late)
        elif spec.behaviour == "reader" and roll < 0.8:
            spec = replace(spec, start_after=late)
            if spec.from_offset is not None and roll < 0.5:
                spec = replace(spec, from_offset=None, from_held=True)
        elif spec.behaviour == "puller" and (spec.read_old or spec.from_offset is not None) \
                and roll < 0.7:
            spec = replace(spec, start_after=late)
        subscribers.append(spec)
    return replace(workload, subscribers=tuple(subscribers))


def delays(rng: random.Random) -> Workload:
    """Delayed delivery (G12) above all: every producer delays half its publishes by up
    to 4 s and keys its messages; strict and windowed readers see the due order; every
    fault kind, and disk topics half the time (due times survive restarts)."""
    w = disk(rng) if rng.random() < 0.5 else default(rng)
    producers = tuple(replace(p, delay=4.0, keyed=True) for p in w.producers)
    return replace(w, scenario="delays", producers=producers)


def delays_disk(rng: random.Random) -> Workload:
    """Delayed delivery on disk topics only (G12 with G9): every producer delays half its
    publishes, some by up to 12 s, so a pending message sits at a subscription's cursor
    through many cleanup passes, log segments and restarts (crashes, power losses,
    flipped bits) while every later message is acked and must still be cleaned up."""
    w = disk(rng)
    config = dict(w.config)
    config["storage"] = {**w.config["storage"], "kind": "disk"}  # type: ignore[dict-item]
    config.pop("topics", None)
    producers = tuple(replace(p, delay=rng.choice((4.0, 12.0)), keyed=True)
                      for p in w.producers)
    return replace(w, scenario="delays-disk", config=config, producers=producers)


def kept_disk(rng: random.Random) -> Workload:
    """Kept delayed messages on disk topics through many segments (G12 with G9): small
    segments, a short dedup window and delays of up to 20 s, so whole segments go while
    a kept message waits, its KEEP record is copied forward before the segment holding
    it goes, and its push reads it back from the copy; with the faults of delays-disk."""
    w = delays_disk(rng)
    config = dict(w.config)
    config["storage"] = {**w.config["storage"], "segment_bytes": 4096}  # type: ignore[dict-item]
    config["message"] = {**w.config["message"], "dedup_window": 4.0}  # type: ignore[dict-item]
    # busier producers: segments fill in seconds, so they go while kept messages wait
    producers = tuple(replace(p, delay=20.0, count=p.count * 3, gap=p.gap / 3)
                      for p in w.producers)
    return replace(w, scenario="kept-disk", config=config, producers=producers,
                   request_timeout=0.5, retry_deadline=1.5, give_up_after=3.0)


def _group(rng: random.Random, first: int, topic: str, name: str,
           key_ordered: bool) -> list[SubscriberSpec]:
    """1-5 members of the shared subscription ``name`` on ``topic``, each on its own
    host with its own window, behaving as workers do: ack, ack slowly, stall on a job,
    crash (no unsubscribe), leave and come back, ack what another member holds, or nak,
    term and hold in progress (G11)."""
    members = []
    for k in range(rng.randint(1, 5)):
        behaviour = rng.choice(("ack", "ack", "slow", "stall", "flaky", "unsub", "meddle",
                                "worker"))
        spec = SubscriberSpec(name=f"w{first + k}", topic=topic, sub_name=name,
                              behaviour=behaviour, live=True, shared=True,
                              key_ordered=key_ordered,
                              max_in_flight=rng.choice((None, 1, 2, 5)))
        if behaviour in ("flaky", "unsub"):
            spec = replace(spec, churn=rng.uniform(2.0, 8.0))
        members.append(spec)
    return members


def shared(rng: random.Random) -> Workload:
    """Shared subscriptions (G10) above all: on each topic a pool of 1-5 workers shares a
    subscription, key-ordered on some topics (producers key their messages), besides a
    plain subscriber or two; members join, leave, crash, stall and meddle; every fault
    kind, and disk topics a third of the time (a group's cursor survives restarts)."""
    w = disk(rng) if rng.random() < 0.33 else default(rng)
    producers = tuple(replace(p, keyed=True, delay=0.0) for p in w.producers)
    subscribers: list[SubscriberSpec] = [
        s for s in w.subscribers if s.behaviour in ("ack", "slow", "flaky", "puller")][:2]
    for i, topic in enumerate(w.topics):
        subscribers += _group(rng, 10 * i, topic, f"pool{i}", key_ordered=rng.random() < 0.5)
    config = dict(w.config)
    readers: tuple[str, ...] = ()
    if rng.random() < 0.5:  # exhausted and termed messages go to dead-letter topics (G11),
        config["dead_letter"] = {"enabled": True}  # which a reader reads back
        readers = ("d0",)
    return replace(w, scenario="shared", config=config, producers=producers,
                   subscribers=tuple(subscribers), dead_letter_readers=readers)


def dead_letters(rng: random.Random) -> Workload:
    """Work queues (G11): workers that ack, nak (now or later), term, hold messages in
    progress past the ack timeout and drop some, on topics most of which have a
    dead-letter policy (exhausted and termed messages go to TOPIC~SUBSCRIPTION, push
    counts survive re-subscribing); a reader of the dead-letter topics; every fault
    kind, and disk topics half the time (dead letters and push counts survive restarts)."""
    w = disk(rng) if rng.random() < 0.5 else default(rng)
    config = dict(w.config)
    config["subscriber"] = {**w.config["subscriber"],  # type: ignore[dict-item]
                            "retry_count": rng.randint(1, 3)}
    if rng.random() < 0.5:
        config["dead_letter"] = {"enabled": True}
    else:  # a policy per topic: most topics dead-letter, some do not (term acks there)
        chosen = rng.sample(w.topics, max(1, len(w.topics) - 1))
        policies = list(config.get("topics") or [])  # type: ignore[call-overload]
        by_topic = {p["match"]: p for p in policies}
        for topic in chosen:
            by_topic[topic] = {**by_topic.get(topic, {"match": topic}), "dead_letter": True}
        config["topics"] = list(by_topic.values())
    workers = [replace(_subscriber(rng, 20 + i, rng.choice(w.topics), "worker"),
                       churn=rng.choice((0.0, rng.uniform(4.0, 10.0))))
               for i in range(rng.randint(2, 4))]
    others = [s for s in w.subscribers if s.behaviour in ("ack", "slow", "puller", "window")]
    # half the runs' messages carry keys and headers: a dead letter keeps them
    producers = tuple(replace(p, keyed=rng.random() < 0.5) for p in w.producers)
    return replace(w, scenario="deadletters", config=config, producers=producers,
                   subscribers=tuple(workers + others[:2]), dead_letter_readers=("d0",))


SCENARIOS: dict[str, Callable[[random.Random], Workload]] = {
    "default": default, "no-faults": no_faults, "crashes": crashes, "network": network,
    "strict": strict, "cleanup": cleanup, "dedup": dedup, "backpressure": backpressure,
    "topics": topics, "policies": policies, "disk": disk, "storage-faults": storage_faults,
    "disk-errors": disk_errors, "dead-disk": dead_disk, "busy-disk": busy_disk, "auth": auth,
    "delays": delays, "delays-disk": delays_disk, "kept-disk": kept_disk, "shared": shared,
    "deadletters": dead_letters,
}
