"""The soak run's parts, and a short soak against a real broker (``make soak`` runs ten
minutes): nothing acked is lost, nothing refused, no process restarted."""

from __future__ import annotations

import sys
from pathlib import Path

import trio

from flux.bench import soak
from flux.bench.soak_worker import Latencies, Ranges
from flux.hashing import shard_for

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # chaos/ and fuzz/ are tools beside the package
    sys.path.insert(0, str(ROOT))


def test_ranges_merge_in_and_out_of_order() -> None:
    r = Ranges()
    for lo in (0, 1, 2, 5, 3, 4, 10):
        r.add(lo, lo + 1)
    assert r.spans == [[0, 6], [10, 11]]
    assert soak._uncovered(0, 12, r.spans) == 5


def test_latency_quantiles_are_within_two_percent() -> None:
    lat = Latencies()
    for us in range(1, 10001):
        lat.add(float(us))
    assert abs(lat.quantile(0.5) - 5000) / 5000 < 0.03
    assert abs(lat.quantile(0.999) - 9990) / 9990 < 0.03 and lat.max == 10000


def test_topics_cover_every_shard_with_both_kinds() -> None:
    topics = soak.pick_topics(24, 2)
    assert len(topics) == 24
    for kind in ("mem", "disk"):
        assert {shard_for(t, 2) for t in topics if f".{kind}." in t} == {0, 1}


def test_rss_slope_is_the_least_squares_one() -> None:
    assert soak.slope([(0, 10), (1, 12), (2, 14)]) == 2.0


def test_a_short_soak_loses_nothing(tmp_path: Path) -> None:
    s = soak.SoakSettings(minutes=0.25, calibrate=3.0, load=0.3, topics=20, out=tmp_path)
    report = trio.run(soak.soak, s, tmp_path, lambda *_: None)
    assert report["acked"] > 0 and report["lost"] == [] and report["restarts"] == 0
    assert not report["refused"], report["refused"]


def test_a_minute_lists_late_deliveries_and_the_longest_loop_lags() -> None:
    consumers = [
        {"n": 5, "max_us": 150e3, "late": [[2.0, 150.0, "a"]],
         "loop_lag_max_ms": 3.0, "loop_lag_at": 1.0},
        {"n": 1, "max_us": 120e3, "late": [[1.0, 120.0, "b"]],
         "loop_lag_max_ms": 9.0, "loop_lag_at": 2.0},
    ]
    producers = [{"acked": 6, "loop_lag_max_ms": 40.0, "loop_lag_at": 5.0}]
    m = soak._merge_minute(consumers, producers)
    assert m["n"] == 6 and m["max_us"] == 150e3
    assert m["late"] == [[1.0, 120.0, "b"], [2.0, 150.0, "a"]]
    assert m["consumers_loop_lag"] == [9.0, 2.0] and m["producers_loop_lag"] == [40.0, 5.0]


def test_the_loop_lag_watch_sees_a_blocked_loop() -> None:
    import time

    from flux.bench.soak_worker import _LoopLag

    async def main() -> dict[str, float]:
        lag = _LoopLag()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lag.watch)
            await trio.sleep(0.05)
            time.sleep(0.2)  # the loop is held: the watch's sleep ends that much late
            await trio.sleep(0.05)
            nursery.cancel_scope.cancel()
        return lag.take()

    seen = trio.run(main)
    assert seen["loop_lag_max_ms"] >= 150 and seen["loop_lag_at"] > 0
