"""How ``flux stats`` shows what the shards hold: rich tables, or one JSON document.

Input is :meth:`flux.client.api.ClientBase.stats` (each shard's STATS reply, by
shard index); nothing here does I/O beyond printing.
"""

from __future__ import annotations

import fnmatch
import json
from typing import Any

from rich.console import Console
from rich.table import Table


def select(stats: dict[int, dict[str, Any]], pattern: str) -> dict[int, dict[str, Any]]:
    """The same replies with only the topics whose name matches ``pattern`` (a glob)."""
    return {index: reply if "unavailable" in reply else
            {**reply, "topics": {name: topic for name, topic in reply["topics"].items()
                                 if fnmatch.fnmatchcase(name, pattern)}}
            for index, reply in stats.items()}


def as_json(stats: dict[int, dict[str, Any]]) -> str:
    """One JSON document: ``{"shards": [reply, ...]}`` in shard order."""
    return json.dumps({"shards": [stats[i] for i in sorted(stats)]}, indent=2, sort_keys=True)


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, seconds = divmod(rest, 60)
    if days:
        return f"{days}d{hours:02d}h"
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{seconds:02d}s" if minutes else f"{seconds}s"


def _bytes(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    size = n / 1024
    for unit in ("KiB", "MiB"):
        if size < 1024:
            return f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"


COUNTERS = ("published", "duplicates", "delivered", "redelivered", "acked", "trimmed")


def _table(title: str, columns: tuple[str, ...], left: tuple[str, ...] = (),
           caption: str | None = None) -> Table:
    table = Table(title=title, title_justify="left", caption=caption, caption_justify="left")
    for column in columns:
        table.add_column(column, justify="left" if column in left else "right", no_wrap=True)
    return table


def _seconds(value: float) -> str:
    return f"{value:g}s"


def _redelivery(policy: dict[str, Any]) -> str:
    return (f"{policy['subscriber.retry_count']}x({_seconds(policy['subscriber.timeout'])}"
            f"+{_seconds(policy['subscriber.retry_interval'])})")


def _policy_row(name: str, policy: dict[str, Any]) -> tuple[str, ...]:
    return (name, policy["match"] or "(global)", _seconds(policy["message.ttl"]),
            _seconds(policy["message.dedup_window"]), _bytes(policy["topic.max_bytes"]),
            _redelivery(policy), _seconds(policy["subscriber.inactive_time"]))


def _disk_row(name: str, topic: dict[str, Any], storage: dict[str, Any]) -> tuple[str, ...]:
    recovered = "-"
    if storage.get("recovered_bytes") is not None:
        recovered = (f"{_bytes(storage['recovered_bytes'])} in"
                     f" {_seconds(storage.get('recovery_seconds', 0.0))}")
    notes = []
    if storage.get("damage_read_back"):
        notes.append(f"recovered while serving: {storage['damage_read_back']}")
    if storage.get("failed"):
        notes.append(f"FAILED: {storage['failed']}")
    if storage.get("new_generation"):
        notes.append(f"new generation: {storage['new_generation']}")
    damage = storage.get("damage")
    if damage:
        notes.append(f"{damage['kind']} at {damage['position']}: {damage['reason']}")
    return (name, f"{topic.get('generation', 0):#018x}", _bytes(storage.get("log_bytes", 0)),
            f"{storage.get('durable', 0):,}", recovered, "; ".join(notes) or "-")


def tables(stats: dict[int, dict[str, Any]]) -> list[Table]:
    """Shards, their counters, topics, the topics' policies and subscriptions, one table
    each (empty ones left out); each fits 80 columns for short topic names."""
    shards = _table("Shards", ("shard", "generation", "up", "sessions", "topics", "memory"),
                    left=("generation",),
                    caption="memory: what messages and ids take, of shard.max_memory")
    counters = _table("Counters (since the shard started)", ("shard", *COUNTERS))
    topics = _table("Topics", ("topic", "shard", "oldest", "next", "held", "bytes", "dedup ids",
                               "subs"), left=("topic",))
    policies = _table("Topic policies", ("topic", "policy", "ttl", "dedup", "max bytes",
                                         "redelivery", "inactive"),
                      left=("topic", "policy"),
                      caption="policy: the topics: pattern that matched, if any;"
                              " redelivery: retry_count x (timeout+retry_interval)")
    disk = _table("Disk topics", ("topic", "generation", "log", "durable", "recovered",
                                  "note"), left=("topic", "generation", "note"),
                  caption="log: bytes its log holds; durable: the position acks and reads"
                          " may reach; recovered: what its last recovery read")
    disk.columns[-1].no_wrap = False  # the note wraps: the other columns stay whole
    disk.columns[-1].overflow = "fold"
    caches = _table("Payload cache (disk topics)", ("shard", "cached", "of", "chunks",
                                                     "read back", "evicted"),
                    caption="payloads kept in memory once durable (storage.cache_bytes);"
                            " read back: records read from disk")
    collector = _table("Garbage collector", ("shard", "tracked", "frozen", "full GCs", "last",
                                             "longest"),
                       caption="objects it tracks and those frozen at start-up; full"
                               " collections since the shard started, the last and the"
                               " longest (ms: the shard's loop waited that long)")
    subs = _table("Subscriptions", ("topic", "name", "mode", "state", "cursor", "lag",
                                    "delayed", "in flight"),
                  left=("topic", "name", "mode", "state"),
                  caption="lag: messages from the cursor to the topic's next offset, due and"
                  " not acked; delayed: not due yet (G12); mode shared: a worker pool (G10)")
    members = _table("Shared subscriptions: members", ("topic", "name", "member", "in flight",
                                                        "window", "credit", "keys", "since"),
                     left=("topic", "name"),
                     caption="in flight: messages this member holds now; keys: keys pinned"
                             " to it (key_ordered)")
    dead = _table("Dead letters (G11)", ("topic", "subscription", "dead-lettered", "refused",
                                         "waiting", "held"), left=("topic", "subscription"),
                  caption="refused: dead letters the dead-letter topic refused (full);"
                          " waiting: still unacked, not pushed; held: in TOPIC~SUBSCRIPTION")
    for index in sorted(stats):
        reply = stats[index]
        if "unavailable" in reply:  # (why: printed under the tables)
            shards.add_row(str(index), "-", "no reply", "-", "-", "-")
            continue
        shards.add_row(str(index), f"{reply['generation']:#018x}", _duration(reply["uptime"]),
                       str(reply["sessions"]), str(len(reply["topics"])),
                       f"{_bytes(reply.get('memory', 0))} / {_bytes(reply.get('max_memory', 0))}")
        cache = reply.get("payload_cache") or {}
        if any(t.get("storage") for t in reply["topics"].values()):
            caches.add_row(str(index), _bytes(cache.get("bytes", 0)),
                           _bytes(cache.get("max_bytes", 0)), f"{cache.get('chunks', 0):,}",
                           f"{cache.get('reads', 0):,}", f"{cache.get('evicted', 0):,}")
        collected = reply.get("gc")
        if collected is not None:
            collector.add_row(str(index), f"{collected['tracked']:,}", f"{collected['frozen']:,}",
                              f"{collected['full_collections']:,}",
                              f"{collected['last_full_ms']:.1f}",
                              f"{collected['longest_full_ms']:.1f}")
        counted = reply.get("counters", {})
        counters.add_row(str(index), *(f"{counted.get(key, 0):,}" for key in COUNTERS))
        for name, why in sorted(reply.get("topics_recovering", {}).items()):
            disk.add_row(name, "-", "-", "-", "-", f"RECOVERING its log: {why}")
        for name, why in sorted(reply.get("topics_refused", {}).items()):
            disk.add_row(name, "-", "-", "-", "-", f"REFUSED: {why}")
        for name in sorted(reply["topics"]):
            topic = reply["topics"][name]
            topics.add_row(name, str(index), f"{topic['oldest']:,}", f"{topic['next_offset']:,}",
                           f"{topic['held']:,}", _bytes(topic["held_bytes"]),
                           f"{topic['dedup_ids']:,}", str(len(topic["subscriptions"])))
            policy = topic.get("policy")
            if policy is not None:
                policies.add_row(*_policy_row(name, policy))
            storage = topic.get("storage")
            if storage is not None:
                disk.add_row(*_disk_row(name, topic, storage))
            held = topic.get("dead_letter_topics", {})
            for sub_name in sorted(topic["subscriptions"]):
                sub = topic["subscriptions"][sub_name]
                if "dead_lettered" in sub:
                    dead.add_row(name, sub_name, f"{sub['dead_lettered']:,}",
                                 f"{sub['dead_letter_refused']:,}",
                                 f"{sub['dead_letter_pending']:,}", f"{held.get(sub_name, 0):,}")
            for sub_name in sorted(topic["subscriptions"]):
                sub = topic["subscriptions"][sub_name]
                shown = "(ephemeral)" if sub["ephemeral"] else sub_name
                state = "active" if sub["active"] else "inactive"
                mode = sub["mode"]
                if sub.get("shared"):
                    mode = "shared, key-ordered" if sub.get("key_ordered") else "shared"
                    state = f"{state}, {len(sub.get('members', []))} members"
                    for i, member in enumerate(sub.get("members", []), 1):
                        members.add_row(name, sub_name, str(i), f"{member['in_flight']:,}",
                                        f"{member['max_in_flight']:,}", f"{member['credit']:,}",
                                        f"{member['keys']:,}", _duration(member["since"]))
                subs.add_row(name, shown, mode, state, f"{sub['cursor']:,}",
                             f"{sub.get('lag', max(0, topic['next_offset'] - sub['cursor'])):,}",
                             f"{sub.get('delayed', 0):,}", f"{sub['in_flight']:,}")
    retired = sum(reply.get("retired_topics", 0) for reply in stats.values()
                  if "unavailable" not in reply)
    if retired:
        topics.title = f"Topics ({retired:,} more retired: empty, only their next offset kept)"
    return [t for t in (shards, counters, topics, policies, disk, caches, subs, members, dead,
                        collector)
            if t.row_count]


def show(stats: dict[int, dict[str, Any]], pattern: str = "*",
         console: Console | None = None) -> None:
    """Print the tables (and a line when no topic matches ``pattern``)."""
    console = console or Console()
    for table in tables(stats):
        console.print(table)
    for index in sorted(stats):
        why = stats[index].get("unavailable")
        if why is not None:
            console.print(f"shard {index}: no reply ({why})", markup=False, highlight=False)
    if not any(reply.get("topics") for reply in stats.values()):
        console.print("no topics" if pattern == "*" else f"no topics match {pattern!r}",
                      markup=False, highlight=False)
