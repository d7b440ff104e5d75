"""The router's HTTP endpoint against a real ``flux serve``: /metrics, /healthz, /api/."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import BrokerFactory
from tests.monitor.support import (
    AUDIT,
    AUDIT_PAYLOADS,
    BILLING_ACKED,
    ORDERS,
    ORDERS_COUNT,
    get,
    get_json,
    run_workload,
    start,
    subscription,
    wait_for,
)

pytestmark = pytest.mark.integration


def samples(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Every sample of a Prometheus text page by sample name, parsed by prometheus_client."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return out


def value(found: dict[str, list[tuple[dict[str, str], float]]], name: str,
          **labels: str) -> float:
    matching = [v for have, v in found.get(name, []) if labels.items() <= have.items()]
    assert len(matching) == 1, (name, labels, found.get(name))
    return matching[0]


def total(found: dict[str, list[tuple[dict[str, str], float]]], name: str) -> float:
    return sum(v for _, v in found.get(name, []))


def test_metrics_parse_and_match_what_was_published_and_acked(
        broker_factory: BrokerFactory) -> None:
    monitored = start(broker_factory)
    run_workload(monitored.broker.url)

    def gathered() -> dict[str, Any] | None:
        status, kind, body = get(monitored.url + "metrics")
        assert status == 200 and kind.startswith("text/plain"), (status, kind)
        found = samples(body.decode())
        lags = [v for labels, v in found.get("flux_subscription_lag_messages", [])
                if labels["subscription"] == "billing"]
        return found if lags == [ORDERS_COUNT - BILLING_ACKED] else None

    found = wait_for(gathered, "billing's lag in /metrics")
    assert total(found, "flux_messages_published_total") == ORDERS_COUNT + len(AUDIT_PAYLOADS)
    assert total(found, "flux_messages_duplicate_total") == 1
    assert total(found, "flux_messages_acked_total") == BILLING_ACKED
    assert total(found, "flux_bytes_in_total") == (
        sum(len(f"order {i}") for i in range(ORDERS_COUNT)) + sum(map(len, AUDIT_PAYLOADS)))
    assert value(found, "flux_topic_messages_held", topic=ORDERS) == ORDERS_COUNT
    assert value(found, "flux_topic_next_offset", topic=ORDERS) == ORDERS_COUNT
    assert value(found, "flux_topic_messages_held", topic=AUDIT) == len(AUDIT_PAYLOADS)
    assert value(found, "flux_subscription_cursor", topic=ORDERS,
                 subscription="billing") == BILLING_ACKED
    assert value(found, "flux_subscription_lag_messages", topic=AUDIT,
                 subscription="replay") == len(AUDIT_PAYLOADS)
    assert value(found, "flux_subscription_active", subscription="billing") == 0
    # each publish was one PUBLISH frame, answered: one observation each (the duplicate too)
    frames = ORDERS_COUNT + 1 + len(AUDIT_PAYLOADS)
    assert total(found, "flux_publish_ack_seconds_count") == frames
    assert sum(v for labels, v in found["flux_publish_ack_seconds_bucket"]
               if labels["le"] == "+Inf") == frames
    assert 0 < total(found, "flux_publish_ack_seconds_sum") < frames
    shards = monitored.broker.shards
    for index, shard in shards.items():
        assert value(found, "flux_shard_up", shard=str(index)) == 1
        assert value(found, "flux_shard_generation_info", shard=str(index),
                     generation=f"{shard.generation:#018x}") == 1
        assert value(found, "flux_shard_memory_bytes", shard=str(index)) >= 0
    assert len(found["flux_shard_up"]) == len(shards)


def test_healthz_is_200_with_every_shard_registered(broker_factory: BrokerFactory) -> None:
    monitored = start(broker_factory)
    status, kind, body = get(monitored.url + "healthz")
    assert (status, kind) == (200, "application/json")
    health = json.loads(body)
    assert health["status"] == "ok"
    assert [s["registered"] for s in health["shards"]] == [True, True]


def test_api_lists_topics_subscriptions_and_shards(broker_factory: BrokerFactory) -> None:
    monitored = start(broker_factory)
    run_workload(monitored.broker.url)
    billing = wait_for(lambda: (lambda s: s if s and s["lag"] == ORDERS_COUNT - BILLING_ACKED
                                else None)(subscription(monitored.url, ORDERS, "billing")),
                       "billing in /api/subscriptions")
    assert (billing["mode"], billing["active"], billing["cursor"]) == ("push", False,
                                                                        BILLING_ACKED)
    topics = {t["topic"]: t for t in get_json(monitored.url + "api/topics")["topics"]}
    assert topics[ORDERS]["held"] == ORDERS_COUNT
    assert topics[ORDERS]["subscriptions"] == 1
    assert topics[AUDIT]["next_offset"] == len(AUDIT_PAYLOADS)
    shards = get_json(monitored.url + "api/shards")["shards"]
    assert [s["index"] for s in shards] == [0, 1] and all(s["up"] for s in shards)
    overview = get_json(monitored.url + "api/overview")
    assert overview["shard_count"] == 2 and overview["topics"] == 2
    assert set(overview["series"]) >= {"published", "delivered"}


def test_message_browser_reads_offset_ranges_as_text_or_hex_with_a_size_cap(
        broker_factory: BrokerFactory) -> None:
    monitored = start(broker_factory)
    run_workload(monitored.broker.url)
    page = get_json(monitored.url + f"api/topics/{ORDERS}/messages?offset=3&limit=2")
    assert (page["first"], page["oldest"], page["next"]) == (3, 0, ORDERS_COUNT)
    assert [(m["offset"], m["payload"], m["encoding"], m["id"]) for m in page["messages"]] == [
        (3, "order 3", "utf-8", "order-3"), (4, "order 4", "utf-8", "order-4")]
    audit = get_json(monitored.url + f"api/topics/{AUDIT}/messages")["messages"]
    assert [(m["encoding"], m["truncated"], m["size"]) for m in audit] == [
        ("hex", False, 4), ("utf-8", False, len(AUDIT_PAYLOADS[1])), ("utf-8", True, 5000)]
    assert audit[0]["payload"] == "0001feff"
    assert audit[1]["payload"] == "caf\u00e9 \u2603"
    assert len(audit[2]["payload"]) == 2048
    # nothing was moved: the pull subscription still lags by everything
    assert subscription(monitored.url, AUDIT, "replay") is None or \
        wait_for(lambda: subscription(monitored.url, AUDIT, "replay"), "replay")["lag"] == 3
    unknown = get_json(monitored.url + "api/topics/never.used/messages")
    assert (unknown["messages"], unknown["next"]) == ([], 0)
    status, _, body = get(monitored.url + "api/topics/bad..name/messages")
    assert status == 400 and json.loads(body)["error"] == "InvalidTopic"
    status, _, body = get(monitored.url + f"api/topics/{ORDERS}/messages?offset=-1")
    assert status == 400 and json.loads(body)["error"] == "InvalidRequest"
    status, _, body = get(monitored.url + f"api/topics/{ORDERS}/messages?limit=abc")
    assert status == 400


def test_http_disabled_prints_no_http_line_and_serves_nothing(
        broker_factory: BrokerFactory) -> None:
    broker = broker_factory("http.enabled=false")
    status = broker.stop()
    assert status == 0
    rest = []
    while (line := broker.router.lines.get(timeout=10)) is not None:
        rest.append(line)
    assert rest == ["flux: stopped"]


def test_a_taken_http_port_stops_serve_before_any_shard_starts(tmp_path: Any) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "flux", "serve", "--port", "0", "--shards", "1",
             "--set", f"http.port={port}"],
            capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
            env={**os.environ, "FLUX_RUNTIME_DIR": str(tmp_path)})
    assert done.returncode == 1, done
    assert f"http.port 127.0.0.1:{port}" in done.stderr
    assert "shard 0 listening" not in done.stdout


def test_healthz_is_503_naming_a_shard_that_died_until_its_replacement_registers(
        broker_factory: BrokerFactory) -> None:
    monitored = start(broker_factory)
    old = monitored.broker.shards[1]
    os.kill(old.pid, signal.SIGKILL)
    seen: list[dict[str, Any]] = []

    def unhealthy() -> bool:
        status, _, body = get(monitored.url + "healthz")
        if status == 503:
            seen.append(json.loads(body))
        return status == 503

    wait_for(unhealthy, "/healthz to report the dead shard", timeout=15)
    assert seen[0]["status"] == "unavailable" and seen[0]["missing"] == [1]
    assert "shards [1]" in seen[0]["message"]
    wait_for(lambda: get(monitored.url + "healthz")[0] == 200, "the replacement shard", 30)

    def restarted() -> dict[str, Any] | None:
        found = samples(get(monitored.url + "metrics")[2].decode())
        if value(found, "flux_shard_restarts_total", shard="1") != 1:
            return None
        return found if value(found, "flux_shard_up", shard="1") == 1 else None

    found = wait_for(restarted, "the restart in /metrics")
    [(labels, _)] = [s for s in found["flux_shard_generation_info"] if s[0]["shard"] == "1"]
    assert labels["generation"] != f"{old.generation:#018x}"  # G7: a new generation


def test_fsyncs_of_disk_topics_show_in_the_fsync_histogram(
        broker_factory: BrokerFactory, tmp_path: Any) -> None:
    from flux.client import sync

    monitored = start(broker_factory, f"storage.dir={tmp_path / 'data'}", "storage.kind=disk")
    with sync.connect(monitored.broker.url, retry_deadline=20.0) as client:
        for i in range(5):
            client.publish("ledger.eu", f"entry {i}".encode(), id=f"entry-{i}")

    def fsynced() -> dict[str, Any] | None:
        found = samples(get(monitored.url + "metrics")[2].decode())
        return found if total(found, "flux_fsync_seconds_count") >= 5 else None

    found = wait_for(fsynced, "the fsyncs in /metrics")
    # storage.fsync: always: each acked publish was durable first (one fsync may cover more)
    assert total(found, "flux_fsync_seconds_sum") > 0
    assert total(found, "flux_publish_ack_seconds_count") == 5
    inf = sum(v for labels, v in found["flux_fsync_seconds_bucket"] if labels["le"] == "+Inf")
    assert inf == total(found, "flux_fsync_seconds_count")
    assert value(found, "flux_topic_log_bytes", topic="ledger.eu") > 0
    [ledger] = [t for t in get_json(monitored.url + "api/topics")["topics"]
                if t["topic"] == "ledger.eu"]
    assert ledger["storage"] == "disk" and ledger["log_bytes"] > 0
