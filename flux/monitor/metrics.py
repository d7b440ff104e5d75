"""``/metrics``: the gathered STATS as Prometheus metrics, through ``prometheus_client``.

:class:`FluxCollector` is a custom collector over the monitor's latest
:class:`~flux.monitor.gather.Snapshot`; nothing is counted per message here.
The text is rendered once per gathering and reused by every scrape until the
next one. README "Monitoring" lists every metric; keep the two in step.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from flux.monitor.gather import Snapshot, lag

SHARD = ["shard"]
TOPIC = ["shard", "topic"]
SUBSCRIPTION = ["topic", "subscription"]  # few labels: each costs at every scrape

# counter name suffix -> the STATS counter it reports
MESSAGE_COUNTERS = {
    "published": ("published", "Messages stored (duplicates not counted)."),
    "duplicate": ("duplicates", "Publishes answered as duplicates of a stored id (G3)."),
    "delivered": ("delivered", "First pushes of messages to subscriptions."),
    "redelivered": ("redelivered", "Re-pushes after an ack timeout (G4)."),
    "acked": ("acked", "Acks that moved or filled a subscription's cursor."),
    "trimmed": ("trimmed", "Messages deleted by cleanup (G5)."),
}


class FluxCollector(Collector):
    """Metric families for one snapshot (``snapshot()`` gives the current one)."""

    def __init__(self, snapshot: Callable[[], Snapshot]) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        snap = self._snapshot()
        yield from _shard_metrics(snap)
        yield from _topic_metrics(snap)
        monitor = GaugeMetricFamily("flux_monitor_stats_timestamp_seconds",
                                    "Wall time of the STATS gathering these metrics show.")
        monitor.add_metric([], snap.wall)
        yield monitor


def _shard_metrics(snap: Snapshot) -> Iterator[Metric]:
    up = GaugeMetricFamily("flux_shard_up", "1 if the shard is registered and answered STATS.",
                           labels=SHARD)
    info = GaugeMetricFamily("flux_shard_generation_info",
                             "The shard's current generation (G7), as a label; value 1.",
                             labels=["shard", "generation"])
    restarts = CounterMetricFamily("flux_shard_restarts", "Times the router restarted the shard.",
                                   labels=SHARD)
    uptime = GaugeMetricFamily("flux_shard_uptime_seconds", "Seconds since the shard started.",
                               labels=SHARD)
    memory = GaugeMetricFamily("flux_shard_memory_bytes",
                               "Bytes the shard's messages and ids take, as shard.max_memory"
                               " counts them.", labels=SHARD)
    limit = GaugeMetricFamily("flux_shard_memory_limit_bytes", "shard.max_memory in bytes.",
                              labels=SHARD)
    sessions = GaugeMetricFamily("flux_shard_sessions", "Client connections to the shard.",
                                 labels=SHARD)
    retired = GaugeMetricFamily("flux_shard_retired_topics",
                                "Topics the shard forgot while empty (only their next offset kept).",
                                labels=SHARD)
    counters = {name: CounterMetricFamily(f"flux_messages_{name}", text, labels=SHARD)
                for name, (_, text) in MESSAGE_COUNTERS.items()}
    bytes_in = CounterMetricFamily("flux_bytes_in", "Payload bytes of stored messages.",
                                   labels=SHARD)
    acks = HistogramMetricFamily("flux_publish_ack_seconds",
                                 "Time from a PUBLISH frame's arrival at the shard to its"
                                 " PUBLISHED reply.", labels=SHARD)
    fsyncs = HistogramMetricFamily("flux_fsync_seconds",
                                   "Time each fsync of the shard's disk topic logs took.",
                                   labels=SHARD)
    for view in snap.shards:
        shard = [str(view.entry.index)]
        up.add_metric(shard, 1.0 if view.up else 0.0)
        restarts.add_metric(shard, view.entry.restarts)
        stats = view.stats
        if stats is None:
            continue
        info.add_metric([shard[0], f"{int(stats['generation']):#018x}"], 1.0)
        uptime.add_metric(shard, float(stats["uptime"]))
        memory.add_metric(shard, float(stats.get("memory", 0)))
        limit.add_metric(shard, float(stats.get("max_memory", 0)))
        sessions.add_metric(shard, float(stats["sessions"]))
        retired.add_metric(shard, float(stats.get("retired_topics", 0)))
        counted: dict[str, Any] = stats.get("counters", {})
        for name, (key, _) in MESSAGE_COUNTERS.items():
            counters[name].add_metric(shard, float(counted.get(key, 0)))
        if "bytes_in" in counted:
            bytes_in.add_metric(shard, float(counted["bytes_in"]))
        for family, key in ((acks, "publish_ack_seconds"), (fsyncs, "fsync_seconds")):
            histogram = stats.get(key)
            if histogram is not None:
                family.add_metric(shard, buckets=_buckets(histogram), sum_value=histogram["sum"])
    yield from (up, info, restarts, uptime, memory, limit, sessions, retired)
    yield from counters.values()
    if bytes_in.samples:
        yield bytes_in
    yield from (family for family in (acks, fsyncs) if family.samples)


def _buckets(histogram: dict[str, Any]) -> list[tuple[str, float]]:
    """Cumulative ``(le, count)`` pairs from STATS' per-bucket counts (the last: +Inf)."""
    out: list[tuple[str, float]] = []
    running = 0
    bounds = [*histogram["bounds"], float("inf")]
    for bound, count in zip(bounds, histogram["counts"], strict=True):
        running += count
        out.append(("+Inf" if bound == float("inf") else repr(float(bound)), float(running)))
    return out


def _topic_metrics(snap: Snapshot) -> Iterator[Metric]:
    held = GaugeMetricFamily("flux_topic_messages_held", "Messages the topic holds.",
                             labels=TOPIC)
    held_bytes = GaugeMetricFamily("flux_topic_bytes_held",
                                   "Payload, id and dedup bytes the topic holds"
                                   " (what topic.max_bytes bounds).", labels=TOPIC)
    oldest = GaugeMetricFamily("flux_topic_oldest_offset", "The oldest offset held.",
                               labels=TOPIC)
    next_offset = GaugeMetricFamily("flux_topic_next_offset",
                                    "The offset the next publish gets.", labels=TOPIC)
    dedup = GaugeMetricFamily("flux_topic_dedup_ids", "Message ids remembered for dedup.",
                              labels=TOPIC)
    log_bytes = GaugeMetricFamily("flux_topic_log_bytes", "Bytes of a disk topic's log on disk.",
                                  labels=TOPIC)
    lags = GaugeMetricFamily("flux_subscription_lag_messages",
                             "Messages at or above the cursor not yet acked.",
                             labels=SUBSCRIPTION)
    delayed = GaugeMetricFamily("flux_subscription_delayed_messages",
                                "Delayed messages not due yet that it has not acked (G12).",
                                labels=SUBSCRIPTION)
    in_flight = GaugeMetricFamily("flux_subscription_in_flight",
                                  "Pushed messages waiting for their ack.", labels=SUBSCRIPTION)
    cursor = GaugeMetricFamily("flux_subscription_cursor", "The lowest unacked offset.",
                               labels=SUBSCRIPTION)
    redelivered = CounterMetricFamily("flux_subscription_redelivered",
                                      "Re-pushes to this subscription after ack timeouts.",
                                      labels=SUBSCRIPTION)
    active = GaugeMetricFamily("flux_subscription_active",
                               "1 if a session is attached (or a pull reader is active).",
                               labels=SUBSCRIPTION)
    for index, name, topic in snap.topics():
        labels = [str(index), name]
        held.add_metric(labels, float(topic["held"]))
        held_bytes.add_metric(labels, float(topic["held_bytes"]))
        oldest.add_metric(labels, float(topic["oldest"]))
        next_offset.add_metric(labels, float(topic["next_offset"]))
        dedup.add_metric(labels, float(topic["dedup_ids"]))
        storage = topic.get("storage")
        if storage:
            log_bytes.add_metric(labels, float(storage.get("log_bytes", 0)))
        for sub_name in sorted(topic["subscriptions"]):
            sub = topic["subscriptions"][sub_name]
            sub_labels = [name, sub_name]
            lags.add_metric(sub_labels, float(lag(topic, sub)))
            delayed.add_metric(sub_labels, float(sub.get("delayed", 0)))
            in_flight.add_metric(sub_labels, float(sub["in_flight"]))
            cursor.add_metric(sub_labels, float(sub["cursor"]))
            active.add_metric(sub_labels, 1.0 if sub["active"] else 0.0)
            redelivered.add_metric(sub_labels, float(sub.get("redelivered", 0)))
    yield from (held, held_bytes, oldest, next_offset, dedup, log_bytes, lags, delayed, in_flight,
                cursor, active, redelivered)


class MetricsPage:
    """The ``/metrics`` text of the current snapshot, rendered once per snapshot."""

    def __init__(self, snapshot: Callable[[], Snapshot]) -> None:
        self._snapshot = snapshot
        self._registry = CollectorRegistry(auto_describe=False)
        self._registry.register(FluxCollector(snapshot))
        self._rendered: tuple[Snapshot, bytes] | None = None

    def render(self) -> bytes:
        """The Prometheus text exposition of the current snapshot."""
        snap = self._snapshot()
        if self._rendered is None or self._rendered[0] is not snap:
            self._rendered = (snap, generate_latest(self._registry))
        return self._rendered[1]
