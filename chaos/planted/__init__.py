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
}


def plant(name: str) -> None:
    """Patch the shard's classes in this process. Raises KeyError for an unknown name."""
    from flux.shard.dedup import DedupWindow
    from flux.shard.subscription import Subscription

    if name not in PLANTED:
        raise KeyError(f"unknown planted bug {name!r}; known: {', '.join(PLANTED)}")
    if name == "skip-dedup":
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
