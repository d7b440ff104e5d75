"""How the router starts and watches shards: OS processes, or tasks in a nursery.

:class:`ProcessLauncher` runs ``python -m flux.shard`` in its own session (so Ctrl-C
reaches only the router), waits on its children and polls adopted pids.
:class:`TaskLauncher` runs ``run_shard`` as a task, for in-process tests and the
simulator. Both implement :class:`flux.host.Launcher`; restart policy is the router's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

from flux.host import Host, ShardProcess, ShardSpec
from flux.shard.server import run_shard

log = logging.getLogger("flux.router")

POLL_INTERVAL = 0.2   # seconds between liveness checks of an adopted shard
STATUS_UNKNOWN = -1   # exit status of an adopted shard (not our child: we cannot reap it)


class ChildShard:
    """A shard process this router started; its exit is seen by waiting on it."""

    def __init__(self, index: int, process: trio.Process) -> None:
        self.index = index
        self.pid = process.pid
        self._process = process

    async def wait(self) -> int:
        return await self._process.wait()

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self._process.kill()

    def terminate(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self._process.terminate()


class AdoptedShard:
    """A shard process a previous router started; watched by polling its pid."""

    def __init__(self, index: int, pid: int, host: Host) -> None:
        self.index = index
        self.pid = pid
        self._host = host

    async def wait(self) -> int:
        while pid_alive(self.pid):
            await self._host.sleep_until(self._host.now() + POLL_INTERVAL)
        return STATUS_UNKNOWN

    def kill(self) -> None:
        self._signal(signal.SIGKILL)

    def terminate(self) -> None:
        self._signal(signal.SIGTERM)

    def _signal(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(self.pid, signum)


def pid_alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie, exited but not yet reaped, counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    except OSError:  # no procfs: trust kill(0)
        return True
    return stat.rpartition(")")[2].split()[:1] not in (["Z"], ["X"])


def is_shard_process(pid: int, index: int) -> bool:
    """Whether ``pid`` looks like the ``flux.shard`` process of shard ``index``.

    Guards against pid reuse before the router adopts, signals or kills a pid.
    """
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:
        return False
    except OSError:  # no procfs: cannot tell, trust the registration
        return pid_alive(pid)
    return b"flux.shard" in cmdline and f'"index": {index},'.encode() in cmdline


class ProcessLauncher:
    """Starts shards as ``python -m flux.shard`` processes, each in its own session."""

    def __init__(self, host: Host, *, python: str = sys.executable) -> None:
        self.host = host
        self.python = python

    async def launch(self, spec: ShardSpec) -> ShardProcess:
        """Start shard ``spec.index``; raises OSError if the process cannot be started.

        The spec goes on the command line without the broker secret, which the shard
        reads from its standard input (a pipe), so ``ps`` never shows it.
        """
        fields = dataclasses.asdict(spec)
        del fields["secret"]
        args = [self.python, "-m", "flux.shard", "--spec", json.dumps(fields)]
        # stdout is the router's (parsed by scripts); a shard logs to stderr only
        process = await trio.lowlevel.open_process(
            args, start_new_session=True, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
            env=_child_env())
        assert process.stdin is not None
        try:
            await process.stdin.send_all(spec.secret.encode() + b"\n")
            await process.stdin.aclose()
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:  # it died at once
            log.warning("shard %d (pid %d) did not take its secret: %s", spec.index,
                        process.pid, exc)
        return ChildShard(spec.index, process)

    def adopt(self, index: int, pid: int) -> ShardProcess:
        """Watch a running shard by pid; raises ProcessLookupError if it is not a shard."""
        if not is_shard_process(pid, index) or not pid_alive(pid):
            raise ProcessLookupError(f"pid {pid} is not a running flux shard")
        return AdoptedShard(index, pid, self.host)


def _child_env() -> dict[str, str]:
    """The environment, with this copy of flux importable whatever the working directory."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])
    paths = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = root + (os.pathsep + paths if paths else "")
    return env


# -- shards as tasks ---------------------------------------------------------------------


@dataclasses.dataclass(eq=False)
class TaskShard:
    """A shard running as a task; ``kill`` cancels it, ``terminate`` drains it."""

    index: int
    pid: int
    spec: ShardSpec
    scope: trio.CancelScope = dataclasses.field(default_factory=trio.CancelScope)
    stop: trio.Event = dataclasses.field(default_factory=trio.Event)
    done: trio.Event = dataclasses.field(default_factory=trio.Event)
    started: trio.Event = dataclasses.field(default_factory=trio.Event)
    port: int | None = None
    status: int | None = None
    error: BaseException | None = None

    async def wait(self) -> int:
        await self.done.wait()
        assert self.status is not None
        return self.status

    def kill(self) -> None:
        self.scope.cancel()

    def terminate(self) -> None:
        self.stop.set()


class TaskLauncher:
    """Runs each shard as a task in ``nursery`` with a host from ``host_factory(spec)``.

    The nursery belongs to the caller (a test or the simulator), so shards outlive
    a router that is cancelled. Fake pids start at ``first_pid``. A shard that raises
    ends with status 1 and its error kept in ``TaskShard.error`` (and ``errors``).
    """

    def __init__(self, nursery: trio.Nursery, host_factory: Callable[[ShardSpec], Host], *,
                 first_pid: int = 1000) -> None:
        self.nursery = nursery
        self.host_factory = host_factory
        self.shards: dict[int, TaskShard] = {}
        self.errors: list[BaseException] = []
        self._pids = itertools.count(first_pid)

    async def launch(self, spec: ShardSpec) -> ShardProcess:
        shard = TaskShard(spec.index, next(self._pids), spec)
        self.shards[shard.pid] = shard
        self.nursery.start_soon(self._run, shard)
        await shard.started.wait()
        return shard

    def adopt(self, index: int, pid: int) -> ShardProcess:
        shard = self.shards.get(pid)
        if shard is None or shard.index != index or shard.done.is_set():
            raise ProcessLookupError(f"no running shard {index} with pid {pid}")
        return shard

    async def _run(self, shard: TaskShard) -> None:
        status = _Started(shard)
        try:
            with shard.scope:
                await self.run_shard(shard, status)
            shard.status = -signal.SIGKILL if shard.scope.cancelled_caught else 0
        except Exception as exc:  # a crashing shard must not take the launcher down
            log.exception("shard %d (pid %d) crashed", shard.index, shard.pid)
            shard.status, shard.error = 1, exc
            self.errors.append(exc)
        finally:
            if shard.status is None:
                shard.status = -signal.SIGKILL
            self.shards.pop(shard.pid, None)
            shard.started.set()
            shard.done.set()

    async def run_shard(self, shard: TaskShard, task_status: Any) -> None:
        """Run one incarnation (the simulator overrides this to add faults)."""
        await run_shard(self.host_factory(shard.spec), shard.spec, pid=shard.pid,
                        stop=shard.stop, task_status=task_status)


class _Started:
    def __init__(self, shard: TaskShard) -> None:
        self.shard = shard

    def started(self, value: Any = None) -> None:
        self.shard.port = value
        self.shard.started.set()
