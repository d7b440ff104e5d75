"""Tiny runs of the durable-topic bench paths (``flux bench --sections durable,recovery``).

They start the real peers (the ``nats-server`` of the bench extra; Redis, which the
bench installs with apt-get as root) and print their rows. Never asserts a speed:
only that each row was measured, or says plainly why it could not be.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from flux.bench import durable, recovery, systems
from flux.bench.runner import Plan
from flux.cli import main

pytestmark = pytest.mark.integration


def test_nats_server_comes_from_the_bench_extra() -> None:
    binary = systems.nats_server_binary()
    out = subprocess.run([binary, "--version"], capture_output=True, timeout=10).stdout.decode()
    found = re.search(r"v(\d+)\.(\d+)\.", out)
    assert found, out
    major, minor = int(found.group(1)), int(found.group(2))
    assert (major, minor) >= (2, 10), out   # sync_interval needs a current server


def test_peer_configs_pin_their_durability() -> None:
    assert "sync_interval: always" in systems.nats_config(4222, "/tmp/x", sync_always=True)
    assert "sync_interval" not in systems.nats_config(4222, "/tmp/x", sync_always=False)
    args = systems.redis_args(6379, "/tmp/x", "always")
    assert args[args.index("--appendonly") + 1] == "yes"
    assert args[args.index("--appendfsync") + 1] == "always"
    assert systems.redis_args(6379, "/tmp/x", None)[-2:] == ["--appendonly", "no"]
    assert systems.FluxStorage("interval", 1.0).config() == {
        "storage": {"fsync": "interval", "fsync_interval": 1.0}}
    assert systems.FluxStorage("always").settings() == {"storage.fsync": "always"}


def test_rows_follow_the_peers_asked_for() -> None:
    keys = [d.key for d in durable.chosen(Plan(["flux", "redis"]))]
    assert keys == ["flux-memory", "flux-always", "flux-interval", "redis-everysec", "redis-always"]
    assert [d.key for d in durable.chosen(Plan(["nats", "jetstream"]))] == [
        "jetstream-file", "jetstream-always"]


def test_sizes_parse_with_binary_units() -> None:
    assert recovery.parse_bytes("1G") == 1 << 30
    assert recovery.parse_bytes("200K") == 200 << 10
    assert recovery.parse_bytes("1.5MiB") == 3 << 19
    assert recovery.parse_bytes("1000") == 1000
    with pytest.raises(ValueError, match="a size like"):
        recovery.parse_bytes("lots")


def test_a_refused_flux_config_is_a_bench_error_with_the_servers_reason(tmp_path: Path) -> None:
    with pytest.raises(systems.BenchError, match=r"flux serve exited with status \d+: .*nope"):
        systems.start_flux(1, {"nope.key": 1}, data_dir=str(tmp_path))


def _redis_expected() -> bool:
    """Redis rows must run where the bench can have redis-server (installed, or root)."""
    return shutil.which("redis-server") is not None or os.path.exists("/usr/bin/redis-server") or (
        os.geteuid() == 0 and shutil.which("apt-get") is not None)


def test_quick_durable_bench_prints_every_row(tmp_path: Path) -> None:
    out = tmp_path / "results"
    result = CliRunner().invoke(main, [
        "bench", "--quick", "--sections", "durable", "--vs", "all", "--count", "2000",
        "--rate", "1000", "--in-flight", "512", "--data-dir", str(tmp_path), "--out", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads((out / "bench.json").read_text())["durable"]
    rows = data["rows"]
    peers = ["flux-memory", "jetstream-file", "jetstream-always"]
    peers += ["redis-everysec", "redis-always"] if _redis_expected() else []
    for key in peers:
        assert rows[key]["e2e"] is not None, (key, rows[key], result.output)
        assert rows[key]["in_flight"] == 512
    for key in ("flux-always", "flux-interval"):   # until the shard keeps disk topics
        row = rows[key]
        assert row["e2e"] is not None or row["unavailable"].startswith("not available: "), row
    assert rows["flux-memory"]["ack_latency"]["p50"] > 0
    assert data["fsync"]["fsync_p50_ms"] > 0
    probes = data["fsync"]["probe_p50_ms"]   # just before and just after the always run
    assert len(probes) == 2 and data["fsync"]["fsync_p50_ms"] == pytest.approx(sum(probes) / 2)
    assert len(data["goals"]) == 6
    output = " ".join(result.output.split())
    assert "512 publishes in flight" in output
    assert "JetStream, file, sync_interval always" in output
    assert "disk fsync in" in output and "Goals (issue 16)" in output
    assert not list(tmp_path.glob("flux-bench-disk-*")), "a data directory was left behind"


def test_recovery_bench_reports_a_time_or_why_not(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, [
        "bench", "--sections", "recovery", "--recovery-bytes", "100K", "--keep-page-cache", "--data-dir",
        str(tmp_path), "--out", str(tmp_path / "results")])
    assert result.exit_code == 0, result.output
    output = " ".join(result.output.split())
    assert "recovery of 0.1 MiB" in output
    assert any(s in output for s in ("served after", "not available:", "not recovered:")), output
    if "served after" in output:  # with the restarted shard's own recovery time, from STATS
        assert "the shard's own recovery" in output, output


def test_recovery_of_a_memory_topic_says_it_was_lost() -> None:
    # the same fill, SIGKILL and FETCH on a memory topic: the restart must show as a loss
    figures = recovery.measure(20_000, "full", storage=None, timeout=60, drop_cache=False)
    assert figures.messages == 200
    assert figures.fill_seconds is not None
    assert figures.outcome.startswith("not recovered: the restarted shard answered"), figures
    assert "another generation" in figures.line()


class _FakeServe:
    """Stands in for a ``flux serve`` that keeps disk topics: records its arguments and
    announces one shard, as the real one does on stdout."""

    started: list[list[str]] = []

    def __init__(self, args: list[str], **kwargs: object) -> None:
        import io

        self.started.append(args)
        self.stdout = io.BytesIO(b"flux: router listening on 127.0.0.1:1 with 1 shards\n"
                                 b"flux: shard 0 listening on 127.0.0.1:2 (pid 0, generation 0x1)\n")
        self.pid = 0
        self.returncode: int | None = None

    def poll(self) -> int | None:
        return self.returncode

    def send_signal(self, sig: int) -> None:
        self.returncode = -sig

    def wait(self, timeout: float | None = None) -> int:
        return self.returncode or 0

    def kill(self) -> None:
        self.returncode = -9


def test_a_disk_broker_gets_data_dir_and_a_config_with_the_fsync_mode(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import yaml

    monkeypatch.setattr(systems.subprocess, "Popen", _FakeServe)
    monkeypatch.setattr(systems, "_wait_gone", lambda pid, timeout: None)
    _FakeServe.started.clear()
    broker = systems.start_flux(1, storage=systems.FluxStorage("interval", 1.0),
                                data_dir=str(tmp_path))
    args = _FakeServe.started[0]
    data_dir, config = args[args.index("--data-dir") + 1], args[args.index("--config") + 1]
    assert Path(data_dir).parent.parent == tmp_path
    assert yaml.safe_load(Path(config).read_text()) == {
        "storage": {"fsync": "interval", "fsync_interval": 1.0}}
    assert "--set" in args and not any(a.startswith("storage.") for a in args)
    assert broker.url == "flux://127.0.0.1:1" and broker.pids == [0]
    assert broker.settings["storage.fsync"] == "interval"
    broker.stop()
    assert not Path(data_dir).parent.exists(), "the bench's data directory was left behind"
