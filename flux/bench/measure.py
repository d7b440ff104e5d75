"""What the bench reads about processes (CPU time, resident memory) and how it summarises.

Reads ``/proc`` directly (no psutil); on a system without procfs the figures are
None. Also: free loopback ports and percentiles. The bench is a measuring tool, so
unlike broker code it reads the system clock itself (``time.perf_counter``, which
on Linux is CLOCK_MONOTONIC and so comparable between processes).
"""

from __future__ import annotations

import math
import os
import socket
from collections.abc import Iterable, Sequence

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds ``pid`` has used (its own, not its children's)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat.rpartition(b")")[2].split()
    # after the command name: state is field 3, utime 14 and stime 15 (1-based)
    return (int(fields[11]) + int(fields[12])) / _TICKS


def total_cpu(pids: Iterable[int]) -> float | None:
    """CPU seconds used by all of ``pids`` (None if any cannot be read)."""
    total = 0.0
    for pid in pids:
        used = cpu_seconds(pid)
        if used is None:
            return None
        total += used
    return total


def rss_bytes(pid: int) -> int | None:
    """Resident set size of ``pid`` in bytes."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return None


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) of already sorted values, nearest rank."""
    if not sorted_values:
        return float("nan")
    rank = math.ceil(q / 100 * len(sorted_values))   # 1-based
    return sorted_values[max(0, min(len(sorted_values), rank) - 1)]


def median(values: Sequence[float]) -> float:
    """The median (the mean of the middle two for an even count)."""
    s = sorted(values)
    if not s:
        return float("nan")
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2
