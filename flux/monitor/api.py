"""The JSON documents under ``/api/`` and ``/healthz``, built from the monitor's cache.

Pure functions of a :class:`~flux.monitor.gather.Snapshot` (and its
:class:`~flux.monitor.gather.RateHistory`), except :func:`messages`, which reads a
topic through FETCH without a subscription. Payloads are shown as text when
they are UTF-8, else as hex, cut at :data:`PREVIEW_BYTES`.
"""

from __future__ import annotations

from typing import Any

from flux import errors, protocol
from flux.hashing import shard_for
from flux.monitor.gather import COUNTERS, RateHistory, ShardDirectory, Snapshot, StatsGatherer, lag

PREVIEW_BYTES = 2048           # payload bytes shown per message
MAX_MESSAGES = 200             # messages per /api/topics/{topic}/messages page
FETCH_MAX_BYTES = 256 * 1024   # payload + id bytes read per page (at least one message)


def health(directory: ShardDirectory) -> tuple[int, dict[str, Any]]:
    """``(status, body)``: 200 when the router runs and every shard is registered and
    serving, else 503 naming what is missing or still recovering its disk topics."""
    entries = directory.entries()
    missing = [e.index for e in entries if not e.registered]
    recovering = [e.index for e in entries if e.registered and e.recovering]
    shards = [{"index": e.index, "registered": e.registered, "recovering": e.recovering,
               "pid": e.pid, "generation": _hex(e.generation), "restarts": e.restarts}
              for e in entries]
    if directory.stopping():
        return 503, {"status": "stopping", "message": "the broker is stopping", "shards": shards}
    if missing:
        return 503, {"status": "unavailable", "missing": missing, "shards": shards,
                     "message": f"shards {missing} are not registered (starting or restarting)"}
    if recovering:
        return 503, {"status": "recovering", "recovering": recovering, "shards": shards,
                     "message": f"shards {recovering} are recovering their disk topics"}
    return 200, {"status": "ok", "shard_count": len(entries), "shards": shards}


def _hex(generation: int | None) -> str | None:
    return None if generation is None else f"{generation:#018x}"


def overview(snap: Snapshot, history: RateHistory, now: float) -> dict[str, Any]:
    """Shards, broker-wide rates and their recent series (the dashboard's first panel)."""
    return {
        "wall": snap.wall,
        "age": max(0.0, now - snap.at),
        "shard_count": len(snap.shards),
        "shards": shards(snap),
        "rates": {key: history.rate(key) for key in COUNTERS},
        "series": {key: history.series(key) for key in ("published", "delivered", "acked",
                                                         "redelivered")},
        "topics": sum(1 for _ in snap.topics()),
        "subscriptions": sum(len(t["subscriptions"]) for _, _, t in snap.topics()),
    }


def shards(snap: Snapshot) -> list[dict[str, Any]]:
    """One entry per shard: registration, generation, uptime, memory, sessions, counters."""
    out: list[dict[str, Any]] = []
    for view in snap.shards:
        entry, stats = view.entry, view.stats or {}
        out.append({
            "index": entry.index, "up": view.up, "registered": entry.registered,
            "pid": entry.pid, "address": entry.address, "restarts": entry.restarts,
            "generation": _hex(stats.get("generation", entry.generation)),
            "uptime": stats.get("uptime"), "sessions": stats.get("sessions"),
            "memory": stats.get("memory"), "max_memory": stats.get("max_memory"),
            "topics": len(stats.get("topics", {})), "counters": stats.get("counters", {}),
            "error": view.error,
        })
    return out


def topics(snap: Snapshot, history: RateHistory) -> list[dict[str, Any]]:
    """Every topic: where it lives, what it holds, how fast it grows."""
    return [{"topic": name, "shard": index, "oldest": topic["oldest"],
             "next_offset": topic["next_offset"], "held": topic["held"],
             "held_bytes": topic["held_bytes"], "dedup_ids": topic["dedup_ids"],
             "subscriptions": len(topic["subscriptions"]),
             "storage": "disk" if topic.get("storage") else "memory",
             "log_bytes": (topic.get("storage") or {}).get("log_bytes"),
             "rate_in": history.topic_rate(name), "policy": topic.get("policy")}
            for index, name, topic in snap.topics()]


def subscriptions(snap: Snapshot, history: RateHistory) -> list[dict[str, Any]]:
    """Every subscription with its cursor, exact lag, in-flight count and ack rate."""
    out: list[dict[str, Any]] = []
    for index, name, topic in snap.topics():
        for sub_name in sorted(topic["subscriptions"]):
            sub = topic["subscriptions"][sub_name]
            out.append({"topic": name, "name": sub_name, "shard": index, "mode": sub["mode"],
                        "active": sub["active"], "ephemeral": sub["ephemeral"],
                        "cursor": sub["cursor"], "lag": lag(topic, sub),
                        "in_flight": sub["in_flight"],
                        "redelivered": sub.get("redelivered", 0),
                        "ack_rate": history.ack_rate(name, sub_name)})
    out.sort(key=lambda s: (-s["lag"], s["topic"], s["name"]))
    return out


def payload_view(payload: bytes, limit: int = PREVIEW_BYTES) -> dict[str, Any]:
    """A payload for JSON: UTF-8 text when it decodes, else hex; at most ``limit`` bytes."""
    shown = payload[:limit]
    try:
        text, encoding = payload.decode("utf-8")[:limit], "utf-8"
        if len(text.encode("utf-8")) > limit:
            text = shown.decode("utf-8", "ignore")
    except UnicodeDecodeError:
        text, encoding = shown.hex(), "hex"
    return {"encoding": encoding, "payload": text, "size": len(payload),
            "truncated": len(payload) > limit}


async def messages(gatherer: StatsGatherer, topic: str, offset: int,
                   limit: int = 50) -> dict[str, Any]:
    """Up to ``limit`` held messages of ``topic`` from ``offset`` on, read with an
    anonymous FETCH (no subscription, no cursor moved).

    Raises InvalidTopic for a bad name, InvalidRequest for a bad range, Busy when the
    topic's shard is not registered, and ConnectionLost or RequestTimeout when it does
    not answer.
    """
    protocol.check_topic(topic)
    if offset < 0 or not 0 < limit <= MAX_MESSAGES:
        raise errors.InvalidRequest(f"offset must be >= 0 and limit 1..{MAX_MESSAGES}")
    entries = gatherer.directory.entries()
    index = shard_for(topic, gatherer.directory.shard_count)
    entry = entries[index]
    if not entry.registered or entry.address is None:
        raise errors.Busy(f"shard {index}, which holds {topic!r}, is not registered")
    link = await gatherer.link(entry)
    reply = await link.request([protocol.FETCH, 0, {
        "topic": topic, "offset": offset, "max_messages": limit, "max_bytes": FETCH_MAX_BYTES}])
    count = protocol.check_fetched(reply)
    head, first, ids, payloads, runs = reply[2], reply[3], reply[4], reply[5], reply[6]
    times = list(protocol.times_of(runs))
    return {"topic": topic, "shard": index, "generation": _hex(head["generation"]),
            "oldest": head["oldest"], "next": head["next"], "first": first,
            "messages": [{"offset": first + i, "id": ids[i], "timestamp": times[i],
                          **payload_view(bytes(payloads[i]))} for i in range(count)]}
