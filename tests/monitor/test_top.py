"""``flux top``: its screen from STATS replies, and the real command in a terminal (q quits)."""

from __future__ import annotations

import os
import pty
import re
import select
import subprocess
import sys
import time

import pytest
from rich.console import Console

from flux.monitor.gather import RateHistory
from flux.monitor.top import render, snapshot_of
from tests.conftest import ROOT, BrokerFactory
from tests.monitor.support import BILLING_ACKED, ORDERS, ORDERS_COUNT, run_workload

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b[()][A-Z0-9]|\x1b[=>78]")


def reply(generation: int, published: int, topics: dict[str, object]) -> dict[str, object]:
    return {"generation": generation, "sessions": 1, "counters": {"published": published},
            "topics": topics}


def test_screen_shows_rates_per_shard_and_topic_and_lag_most_behind_first() -> None:
    def topic(next_offset: int, cursors: dict[str, int]) -> dict[str, object]:
        return {"held": next_offset, "next_offset": next_offset, "subscriptions": {
            name: {"mode": "push", "active": True, "cursor": c, "in_flight": 0,
                   "lag": next_offset - c} for name, c in cursors.items()}}

    history = RateHistory()
    first = snapshot_of({0: reply(5, 0, {"a": topic(0, {"slow": 0, "fast": 0})})}, 0.0, 0.0)
    history.add(first)
    later = snapshot_of({0: reply(5, 50, {"a": topic(50, {"slow": 10, "fast": 48})})}, 5.0, 5.0)
    history.add(later)
    console = Console(width=140, record=True, color_system=None)
    console.print(render(later, history, "flux://x:1"))
    text = console.export_text()
    assert text.index("slow") < text.index("fast")  # 40 behind comes before 2 behind
    shard_row = next(line for line in text.splitlines() if "0x0000000000000005" in line)
    assert "10.0" in shard_row  # 50 published in 5 s
    topic_row = next(line for line in text.splitlines() if line.startswith("│ a "))
    assert "10.0" in topic_row


@pytest.mark.integration
def test_flux_top_shows_the_lag_in_a_terminal_and_quits_on_q(
        broker_factory: BrokerFactory) -> None:
    broker = broker_factory()
    run_workload(broker.url)
    leader, follower = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "flux", "top", "--url", broker.url],
                            cwd=ROOT, stdin=follower, stdout=follower, stderr=follower,
                            env={**os.environ, "COLUMNS": "140", "LINES": "50",
                                 "TERM": "xterm"}, start_new_session=True)
    os.close(follower)
    screen = ""
    # billing's row: topic, name, mode, state, cursor, lag
    row = re.compile(rf"{re.escape(ORDERS)}\s*│\s*billing\s*│\s*push\s*│\s*inactive\s*│"
                     rf"\s*{BILLING_ACKED}\s*│\s*{ORDERS_COUNT - BILLING_ACKED}\s*│")
    try:
        deadline = time.monotonic() + 30
        while not row.search(screen):
            assert time.monotonic() < deadline, screen[-3000:]
            ready, _, _ = select.select([leader], [], [], 0.5)
            if ready:
                screen += ANSI.sub("", os.read(leader, 65536).decode(errors="replace"))
        os.write(leader, b"q")
        assert proc.wait(timeout=15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(leader)
