"""Broker bugs planted on purpose, to prove that a chaos run catches them.

Never reachable in production: :func:`plant` is called only by this directory's
``sitecustomize.py``, which Python imports at start-up only when the runner puts
this directory on ``PYTHONPATH`` (``python -m chaos --plant NAME``), and only
then in the broker's processes (it reads ``CHAOS_PLANT``).
"""

from __future__ import annotations

from typing import Any

PLANTED: dict[str, str] = {
    "skip-dedup": "G3: the shard never finds a message id in its dedup window, so a"
                  " retried publish is stored again",
    "cursor-before-ack": "G1/G2: a subscription's cursor moves past a message when it is"
                         " first pushed, not when it is acked",
    "disk-ack-before-write": "G9: a disk topic's log counts a record durable when it is"
                             " queued, and writes it up to half a second later, so a"
                             " SIGKILL loses records already acked and delivered",
    "disk-new-generation": "G9: a shard recovering a disk topic always starts a new"
                           " generation, as if the machine had lost power",
}

# seconds the disk-ack-before-write plant holds queued records before writing them
WRITE_LAG = 0.5


def plant(name: str) -> None:
    """Patch the shard's classes in this process. Raises KeyError for an unknown name."""
    from flux.shard.dedup import DedupWindow
    from flux.shard.subscription import Subscription

    if name not in PLANTED:
        raise KeyError(f"unknown planted bug {name!r}; known: {', '.join(PLANTED)}")
    if name.startswith("disk-"):
        _plant_disk(name)
    elif name == "skip-dedup":
        def forget(self: DedupWindow, message_id: str, *_: Any) -> int | None:
            return None

        def finder(self: DedupWindow, *_: Any) -> Any:
            return lambda message_id: None

        # every way the shard reads the window: lookup(id, now), get(id[, now]),
        # finder([now])(id)
        readers = {"lookup": forget, "get": forget, "finder": finder}
        found = [attr for attr in readers if hasattr(DedupWindow, attr)]
        if not found:
            raise RuntimeError("DedupWindow has none of lookup, get, finder: update the plant")
        for attr in found:
            setattr(DedupWindow, attr, readers[attr])
    elif name == "cursor-before-ack":
        # the shard records first pushes with add_deadlines(at, offsets, 1) (add_deadline
        # with one offset in older versions): move the cursor there
        if not hasattr(Subscription, "add_deadlines") and not hasattr(Subscription, "add_deadline"):
            raise RuntimeError("Subscription has no add_deadline(s): update the plant")
        batch = hasattr(Subscription, "add_deadlines")
        attr = "add_deadlines" if batch else "add_deadline"
        original: Any = getattr(Subscription, attr)

        def add_deadlines(self: Subscription, at: float, offsets: Any, pushes: int) -> None:
            original(self, at, offsets, pushes)
            last = max(offsets) if batch else offsets
            if pushes == 1 and last >= self.cursor:
                self.cursor = last + 1

        setattr(Subscription, attr, add_deadlines)


def _plant_disk(name: str) -> None:
    """The disk plants: patch the log writer or the shard's recovery."""
    import trio

    from flux.shard.disk import ShardStorage
    from flux.storage.writer import LogWriter

    if name == "disk-ack-before-write":
        if not hasattr(LogWriter, "append") or not hasattr(LogWriter, "_write_queued"):
            raise RuntimeError("LogWriter has no append/_write_queued: update the plant")
        append: Any = LogWriter.append
        write_queued: Any = LogWriter._write_queued

        def early_append(self: LogWriter, rtype: int, body: bytes) -> Any:
            appended = append(self, rtype, body)
            self.durable = max(self.durable, self.appended)   # "durable" before any write
            return appended

        async def late_write(self: LogWriter) -> None:
            await trio.sleep(WRITE_LAG)
            await write_queued(self)
            self.durable = max(self.durable, self.appended)

        setattr(LogWriter, "append", early_append)  # noqa: B010
        setattr(LogWriter, "_write_queued", late_write)  # noqa: B010
    elif name == "disk-new-generation":
        if not hasattr(ShardStorage, "_boot_changed"):
            raise RuntimeError("ShardStorage has no _boot_changed: update the plant")

        def always_rebooted(self: ShardStorage, report: Any) -> bool:
            return True

        setattr(ShardStorage, "_boot_changed", always_rebooted)  # noqa: B010
