"""Helpers of the monitoring tests: a broker with its HTTP endpoint, GETs, bounded polling."""

from __future__ import annotations

import dataclasses
import json
import re
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any, TypeVar

from flux.client import sync
from tests.conftest import Broker, BrokerFactory

HTTP_LINE = re.compile(r"^flux: http listening on (http://\S+/)$")
WAIT = 20.0  # seconds a poll for gathered stats may take
T = TypeVar("T")

# the workload every endpoint test checks: what was published and acked, by whom
ORDERS = "orders.eu"
ORDERS_COUNT = 10
BILLING_ACKED = 4          # the "billing" subscription acks the first 4 and leaves
AUDIT = "audit.log"
AUDIT_PAYLOADS = [b"\x00\x01\xfe\xff", "caf\u00e9 \u2603".encode(), b"x" * 5000]


@dataclasses.dataclass
class Monitored:
    """A running broker and its monitoring endpoint's base URL."""

    broker: Broker
    url: str


def start(factory: BrokerFactory, *settings: str) -> Monitored:
    """Start ``flux serve`` (gathering STATS every 0.2 s) and read its http line."""
    broker = factory("http.stats_interval=0.2", *settings)
    line = broker.router.next_line(time.monotonic() + 30)
    match = HTTP_LINE.match(line)
    assert match, f"expected the http line, got {line!r}"
    return Monitored(broker, match.group(1))


def get(url: str, timeout: float = 10.0) -> tuple[int, str, bytes]:
    """GET ``url``: status, content type and body (error statuses too)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, response.headers.get("content-type", ""), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("content-type", ""), exc.read()


def get_json(url: str) -> Any:
    status, _, body = get(url)
    assert status == 200, (url, status, body)
    return json.loads(body)


def wait_for(probe: Callable[[], T | None], what: str, timeout: float = WAIT) -> T:
    """Call ``probe`` until it returns something other than None (or False), bounded."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        last = probe()
        if last is not None and last is not False:
            return last
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what} (last: {last!r})")


def run_workload(url: str) -> None:
    """Publish to two topics; "billing" acks the first BILLING_ACKED orders and leaves."""
    with sync.connect(url, retry_deadline=20.0) as client:
        for i in range(ORDERS_COUNT):
            client.publish(ORDERS, f"order {i}".encode(), id=f"order-{i}")
        client.publish(ORDERS, b"order 0", id="order-0")  # a duplicate: stored once
        for i, payload in enumerate(AUDIT_PAYLOADS):
            client.publish(AUDIT, payload, id=f"audit-{i}")
        with client.subscribe(ORDERS, name="billing", read_old=True, prefetch=BILLING_ACKED,
                              max_in_flight=BILLING_ACKED) as sub:
            for n, msg in enumerate(sub, 1):
                msg.ack()
                if n == BILLING_ACKED:
                    break
        client.subscribe_pull(AUDIT, "replay", read_old=True)


def subscription(url: str, topic: str, name: str) -> dict[str, Any] | None:
    for sub in get_json(url + "api/subscriptions")["subscriptions"]:
        if sub["topic"] == topic and sub["name"] == name:
            return dict(sub)
    return None
