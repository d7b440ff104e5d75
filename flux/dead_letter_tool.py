"""``flux dlq``: list and redrive the dead letters of a topic (G11), over the client.

``list`` finds the topic's dead-letter topics (``TOPIC~SUBSCRIPTION``) in its
shard's STATS and reads each with FETCH: one row per dead letter, with why it
died. ``redrive`` reads one subscription's dead letters through a pull
subscription of the dead-letter topic (``flux-redrive``), publishes each to the
source topic again (payload, key and headers; the reserved ``flux-`` headers
left out) under an id derived from the dead letter's generation and offset, so
a redrive retried stores nothing twice (within the source's dedup window), and
commits the pull cursor past what it republished.
"""

from __future__ import annotations

import json
from typing import Any

import xxhash
from rich.console import Console
from rich.table import Table

from flux.client.api import ClientBase
from flux.client.types import FetchedMessage
from flux.hashing import dead_letter_topic
from flux.message_meta import RESERVED_PREFIX

REDRIVER = "flux-redrive"   # the pull subscription redrive reads a dead-letter topic with
PAGE = 500


def redrive_id(dead_letter: str, generation: int, offset: int) -> str:
    """The id a redriven dead letter is published with: new (no user id collides with
    it) and the same on every retry of the redrive."""
    digest = xxhash.xxh3_128_hexdigest(f"{dead_letter}\0{generation}\0{offset}".encode())
    return f"redrive-{digest}"


async def dead_letter_topics(client: ClientBase, topic: str) -> dict[str, str]:
    """The dead-letter topics of ``topic`` its shard holds: subscription -> topic name."""
    prefix = dead_letter_topic(topic, "")
    found: dict[str, str] = {}
    for reply in (await client.stats()).values():
        for name in reply["topics"]:
            if name.startswith(prefix):
                found[name[len(prefix):]] = name
    return dict(sorted(found.items()))


async def read_all(client: ClientBase, name: str, start: int = 0
                   ) -> tuple[int, list[FetchedMessage]]:
    """Every message ``name`` holds from ``start`` on, and its generation."""
    messages: list[FetchedMessage] = []
    offset, generation = start, 0
    while True:
        page = await client.fetch(name, offset, PAGE)
        generation = page.generation
        messages += page.messages
        if not page.messages:
            return generation, messages
        offset = page.messages[-1].offset + 1
        if offset >= page.next:
            return generation, messages


def row(subscription: str, msg: FetchedMessage, redriven: bool) -> dict[str, Any]:
    """One dead letter as ``flux dlq list --json`` gives it."""
    h = msg.headers
    return {"subscription": subscription, "dead_letter_offset": msg.offset,
            "generation": msg.generation, "id": msg.id, "key": msg.key,
            "offset": int(h.get("flux-offset", -1)), "pushes": int(h.get("flux-pushes", 0)),
            "reason": h.get("flux-reason", ""), "time": float(h.get("flux-time", 0.0)),
            "bytes": len(msg.payload), "redriven": redriven,
            "headers": {k: v for k, v in h.items() if not k.startswith(RESERVED_PREFIX)}}


async def list_rows(client: ClientBase, topic: str) -> list[dict[str, Any]]:
    """The dead letters of every subscription of ``topic``, oldest first per subscription."""
    rows: list[dict[str, Any]] = []
    for subscription, name in (await dead_letter_topics(client, topic)).items():
        _, messages = await read_all(client, name)
        cursor = await _redriven_to(client, name)
        rows += [row(subscription, m, m.offset < cursor) for m in messages]
    return rows


async def _redriven_to(client: ClientBase, name: str) -> int:
    """How far a redrive of ``name`` got (its pull cursor; 0 if none was made)."""
    for reply in (await client.stats()).values():
        topic = reply["topics"].get(name)
        if topic is not None:
            sub = topic["subscriptions"].get(REDRIVER)
            return int(sub["cursor"]) if sub is not None else 0
    return 0


async def redrive(client: ClientBase, topic: str, subscription: str) -> tuple[int, int]:
    """Republish ``subscription``'s dead letters to ``topic`` and commit them read on the
    dead-letter topic; returns (republished, of which already stored: duplicates)."""
    name = dead_letter_topic(topic, subscription)
    info = await client.subscribe_pull(name, REDRIVER, read_old=True)
    cursor, generation = info.cursor, info.generation
    sent = duplicates = 0
    while True:
        page = await client.fetch(name, cursor, PAGE, name=REDRIVER, generation=generation)
        if not page.messages:
            return sent, duplicates
        for msg in page.messages:
            headers = {k: v for k, v in msg.headers.items()
                       if not k.startswith(RESERVED_PREFIX)}
            ack = await client.publish(topic, msg.payload, redrive_id(name, msg.generation,
                                                                       msg.offset),
                                       key=msg.key, headers=headers or None)
            sent += 1
            duplicates += ack.duplicate
        cursor = page.messages[-1].offset + 1
        await client.commit(name, REDRIVER, cursor, generation)


def show(rows: list[dict[str, Any]], topic: str, as_json: bool,
         console: Console | None = None) -> None:
    """Print the rows of ``flux dlq list``: a table, or one JSON document."""
    if as_json:
        print(json.dumps({"topic": topic, "dead_letters": rows}, indent=2, sort_keys=True))
        return
    console = console or Console()
    if not rows:
        console.print(f"no dead letters of {topic!r}", markup=False, highlight=False)
        return
    table = Table(title=f"Dead letters of {topic}", title_justify="left",
                  caption="offset: in the source topic; pushes: the pushes it used;"
                          " redriven: published again by flux dlq redrive",
                  caption_justify="left")
    for column in ("subscription", "offset", "id", "pushes", "reason", "bytes", "redriven"):
        table.add_column(column, justify="right" if column in ("offset", "pushes", "bytes")
                         else "left", no_wrap=column != "reason")
    for r in rows:
        table.add_row(r["subscription"], f"{r['offset']:,}", r["id"], str(r["pushes"]),
                      r["reason"], f"{r['bytes']:,}", "yes" if r["redriven"] else "")
    console.print(table)
