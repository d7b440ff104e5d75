"""Where a router keeps what a restarted router needs to adopt its running shards.

The state is small plain data: the control address, the broker's secret (which
shards prove themselves with, see :mod:`flux.control_proof`) and, per shard, its
pid, generation and addresses. :class:`FileStateStore` keeps it in a per-user
runtime directory, one private file (mode 0600) per public ``host:port``;
:class:`MemoryStateStore` keeps it in memory (tests and the simulator, where it
outlives a simulated router crash).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
from pathlib import Path
from typing import Any, Protocol

from flux.host import runtime_dir

log = logging.getLogger("flux.router")

STATE_VERSION = 2  # 2: the broker secret and each shard's control listener


class StateStore(Protocol):
    """Load, save and clear one router's adoption state."""

    def load(self) -> dict[str, Any] | None:
        """The saved state, or None when there is none (or it is unreadable)."""
        ...

    def save(self, state: dict[str, Any]) -> None:
        """Replace the saved state."""
        ...

    def clear(self) -> None:
        """Forget the state (the router stopped its shards)."""
        ...


class MemoryStateStore:
    """State kept in this object; share one between router incarnations."""

    def __init__(self) -> None:
        self.state: dict[str, Any] | None = None

    def load(self) -> dict[str, Any] | None:
        return json.loads(json.dumps(self.state)) if self.state is not None else None

    def save(self, state: dict[str, Any]) -> None:
        self.state = json.loads(json.dumps(state))

    def clear(self) -> None:
        self.state = None


class FileStateStore:
    """State in ``<runtime_dir>/router-<host>-<port>.json``, written atomically."""

    def __init__(self, host: str, port: int, directory: Path | None = None) -> None:
        safe_host = re.sub(r"[^A-Za-z0-9_.-]", "_", host)
        self.path = (directory or runtime_dir()) / f"router-{safe_host}-{port}.json"

    def load(self) -> dict[str, Any] | None:
        try:
            if self.path.stat().st_uid != os.getuid():  # it would hand us its secret
                log.warning("ignoring router state %s: another user owns it", self.path)
                return None
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            log.warning("ignoring unreadable router state %s: %s", self.path, exc)
            return None
        if not isinstance(data, dict) or data.get("version") != STATE_VERSION:
            log.warning("ignoring router state %s of another version", self.path)
            return None
        return data

    def save(self, state: dict[str, Any]) -> None:
        try:
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            tmp = self.path.with_suffix(f".tmp{os.getpid()}")
            tmp.unlink(missing_ok=True)  # a leftover might have looser permissions
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(json.dumps(state))
            os.replace(tmp, self.path)
        except OSError as exc:  # adoption after a restart degrades; serving does not
            log.warning("cannot save router state %s: %s", self.path, exc)

    def clear(self) -> None:
        with contextlib.suppress(OSError):
            self.path.unlink(missing_ok=True)
