"""``flux top``: a live terminal view of rates per shard and topic and lag per subscription.

Asks every shard for STATS once per refresh through the trio client (the same
replies ``flux stats`` prints), keeps a :class:`~flux.monitor.gather.RateHistory`
of them, and redraws with rich. ``q`` quits (Ctrl-C too).
"""

from __future__ import annotations

import contextlib
import os
import sys
import termios
import tty
from collections.abc import Iterator
from typing import Any

import trio
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from flux.host import RealHost
from flux.monitor.gather import RateHistory, ShardEntry, ShardView, Snapshot, lag

RATE_SECONDS = 5.0   # rates are averaged over about this long


def snapshot_of(stats: dict[int, dict[str, Any]], at: float, wall: float) -> Snapshot:
    """A snapshot from the client's ``stats()`` replies (shard index -> STATS)."""
    return Snapshot(at, wall, tuple(
        ShardView(ShardEntry(index, True, None, int(reply["generation"])), reply)
        for index, reply in sorted(stats.items())))


def _rate(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:,.1f}"


def render(snap: Snapshot, history: RateHistory, url: str, limit: int = 20) -> Group:
    """The screen: a title line, then shards, topics and subscriptions (most behind first)."""
    title = Text.assemble(("flux top", "bold"), f"  {url}  ", ("q quits", "dim"))
    shards = Table(title="Shards", title_justify="left", expand=True)
    for column in ("shard", "generation", "sessions", "topics", "published/s", "delivered/s",
                   "acked/s", "redelivered/s"):
        shards.add_column(column, justify="left" if column == "generation" else "right")
    for view in snap.shards:
        index, stats = view.entry.index, view.stats or {}
        shards.add_row(str(index), f"{int(stats.get('generation', 0)):#018x}",
                       str(stats.get("sessions", "-")), str(len(stats.get("topics", {}))),
                       *(_rate(history.shard_rate(index, key, RATE_SECONDS))
                         for key in ("published", "delivered", "acked", "redelivered")))
    topics = Table(title="Topics (busiest first)", title_justify="left", expand=True)
    for column in ("topic", "shard", "in/s", "held", "next offset", "subscriptions"):
        topics.add_column(column, justify="left" if column == "topic" else "right")
    rows = sorted(snap.topics(), key=lambda t: (-history.topic_rate(t[1], RATE_SECONDS), t[1]))
    for index, name, topic in rows[:limit]:
        topics.add_row(name, str(index), _rate(history.topic_rate(name, RATE_SECONDS)),
                       f"{topic['held']:,}", f"{topic['next_offset']:,}",
                       str(len(topic["subscriptions"])))
    subs = Table(title="Subscriptions (most behind first)", title_justify="left", expand=True)
    for column in ("topic", "subscription", "mode", "state", "cursor", "lag", "in flight",
                   "acks/s"):
        subs.add_column(column, justify="left" if column in ("topic", "subscription", "mode",
                                                             "state") else "right")
    found = [(lag(topic, sub), name, sub_name, sub) for _, name, topic in snap.topics()
             for sub_name, sub in topic["subscriptions"].items()]
    for behind, name, sub_name, sub in sorted(found, key=lambda s: (-s[0], s[1], s[2]))[:limit]:
        subs.add_row(name, sub_name, sub["mode"], "active" if sub["active"] else "inactive",
                     f"{sub['cursor']:,}", Text(f"{behind:,}", style="bold yellow" if behind
                                                else ""),
                     f"{sub['in_flight']:,}",
                     _rate(history.ack_rate(name, sub_name, RATE_SECONDS)))
    return Group(title, shards, topics, subs)


@contextlib.contextmanager
def _keys() -> Iterator[int | None]:
    """Stdin in cbreak mode (keys arrive one by one, unechoed); None when it is no terminal."""
    fd = sys.stdin.fileno() if sys.stdin is not None else -1
    if fd < 0 or not os.isatty(fd):
        yield None
        return
    saved = termios.tcgetattr(fd)
    try:
        tty.setcbreak(fd)
        yield fd
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


async def _wait_for_quit(fd: int) -> None:
    while True:
        await trio.lowlevel.wait_readable(fd)
        if os.read(fd, 32).lower().find(b"q") >= 0:
            return


async def run_top(url: str, interval: float = 1.0, console: Console | None = None, *,
                  token: str | None = None, user: str | None = None,
                  password: str | None = None, tls: Any = None) -> None:
    """Show the live view of the broker at ``url`` until ``q`` (or Ctrl-C).

    Raises ConnectionLost or RetryDeadlineExceeded when the broker cannot be reached.
    """
    from flux.client.trio import connect

    host = RealHost("flux-top")
    history = RateHistory(keep_seconds=60.0)
    console = console or Console()
    with _keys() as fd:
        async with connect(url, retry_deadline=10.0, token=token, user=user,
                           password=password, tls=tls) as client, trio.open_nursery() as nursery:
            if fd is not None:
                async def quit_on_key() -> None:
                    await _wait_for_quit(fd)
                    nursery.cancel_scope.cancel()

                nursery.start_soon(quit_on_key)
            with Live(console=console, auto_refresh=False, screen=console.is_terminal) as live:
                while True:
                    started = host.now()
                    snap = snapshot_of(await client.stats(), host.now(), host.wall_time())
                    history.add(snap)
                    live.update(render(snap, history, url), refresh=True)
                    await host.sleep_until(started + interval)
