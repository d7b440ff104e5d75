"""Start bench worker processes, line them up, let them go and collect their results."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from flux.bench.worker import Spec

READY_TIMEOUT = 60.0


class WorkerError(Exception):
    """A worker failed to start or to report."""


class Worker:
    """One ``python -m flux.bench.worker`` process."""

    def __init__(self, spec: Spec) -> None:
        self.spec = spec
        root = str(Path(__file__).resolve().parents[2])
        env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
        # stderr goes to a file: a chatty worker must never block on a full pipe
        self.errors = tempfile.TemporaryFile()  # noqa: SIM115 (closed by kill())
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "flux.bench.worker", json.dumps(asdict(spec))],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.errors, env=env)

    def _line(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait()
            self.errors.seek(0)
            err = self.errors.read().decode(errors="replace")[-2000:]
            raise WorkerError(f"{self.spec.system} {self.spec.role} exited: {err.strip()}")
        event: dict[str, Any] = json.loads(line)
        return event

    def wait_ready(self) -> None:
        event = self._line()
        if event.get("event") == "result":
            raise WorkerError(f"{self.spec.system} {self.spec.role}: {event.get('error')}")

    def go(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(b"go\n")
        self.proc.stdin.flush()

    def result(self) -> dict[str, Any]:
        event = self._line()
        self.proc.wait(timeout=30)
        return event

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.errors.close()


def run_workers(specs: list[Spec], at_go: Callable[[], None] | None = None
                ) -> list[dict[str, Any]]:
    """Start ``specs`` in order (each ready before the next starts), then let all go
    (calling ``at_go`` just before); returns each worker's result."""
    workers: list[Worker] = []
    try:
        for spec in specs:
            worker = Worker(spec)
            workers.append(worker)
            worker.wait_ready()
        time.sleep(0.05)
        if at_go is not None:
            at_go()
        for worker in workers:
            worker.go()
        return [worker.result() for worker in workers]
    finally:
        for worker in workers:
            worker.kill()
