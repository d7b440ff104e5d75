"""Checks on bad input (G8): every bad request a client sends on purpose gets a typed
answer on its own connection, a PUBLISH judges each item on its own, and nothing but
framing corruption closes the connection. (That no input crashes a shard is the
runner's: a shard that raises fails the run.)"""

from __future__ import annotations

from flux.sim import history as h
from flux.sim.checker import Report
from flux.sim.checker.index import Index

# errors that say "not now" rather than "never": a valid item may get one; and
# NotAuthorized, a typed refusal of a well-formed item whose user may not publish there
# (whether it was right is G13's to judge, in access.py)
RETRYABLE = frozenset({"Busy", "TopicFull", "ShuttingDown", "WrongShard", "StorageUnavailable",
                       "NotAuthorized"})
UNTYPED = frozenset({"RemoteError", "FluxError", "LocalError"})


def check(index: Index, report: Report) -> None:
    sent: dict[tuple[str, int], h.BadRequestSent] = {}
    for e in index.history:
        if isinstance(e, h.BadRequestSent):
            sent[(e.client, e.rid)] = e
        elif isinstance(e, h.BadRequestAnswered):
            request = sent.get((e.client, e.rid))
            if request is not None:
                _check_answer(request, e, report)
        elif isinstance(e, h.BadRequestUnanswered):
            _check_unanswered(index, e, report)
    report.count("bad_requests", len(sent))


def _check_answer(request: h.BadRequestSent, e: h.BadRequestAnswered, report: Report) -> None:
    """G8/untyped-error: the answer is an ERROR of a class a caller can act on, or (for a
    PUBLISH) per-item refusals of such classes. G8/batch-item: inside a PUBLISH each
    item gets its own result: the valid ones are stored (or refused for a reason that
    passes, such as Busy or TopicFull), the invalid ones refused, never stored. Both
    read only the answer on the request's own connection, so no delay can fake them."""
    where = f"{e.client} -> shard {e.shard}: {e.what} (rid {e.rid})"
    report.examine("G8", "untyped-error")
    names = [e.error] if e.error else [r.split(":", 1)[1] for r in e.refused]
    for name in names:
        if name in UNTYPED or name.startswith("frame "):
            report.add("G8", "untyped-error", e.t, f"{where} was answered with {name}")
    if not request.what.startswith("publish"):
        return
    report.examine("G8", "batch-item")
    if e.error:
        if request.valid and e.error not in RETRYABLE:
            report.add("G8", "batch-item", e.t,
                       f"{where}: the whole PUBLISH was refused ({e.error}); its valid items"
                       f" {list(request.valid)} must be judged on their own")
        return
    refused = {int(r.split(":", 1)[0]): r.split(":", 1)[1] for r in e.refused}
    for i in request.valid:
        if i not in e.stored and refused.get(i) not in RETRYABLE:
            report.add("G8", "batch-item", e.t,
                       f"{where}: valid item {i} was refused ({refused.get(i)}) beside"
                       " invalid ones")
    for i in e.stored:
        if i not in request.valid:
            report.add("G8", "batch-item", e.t, f"{where}: invalid item {i} was stored")


def _check_unanswered(index: Index, e: h.BadRequestUnanswered, report: Report) -> None:
    """G8/unanswered: a bad request that is not framing corruption never closes its
    connection and is always answered. Sound under faults: it judges only requests
    whose link (the client and the shard's host) no fault touched from the sending
    to the giving up, a span of seconds, many times the latency bound."""
    report.examine("G8", "unanswered")
    if index.quiet((e.client, f"shard-{e.shard}"), e.sent, e.t):
        how = "the shard closed the connection" if e.reason == "closed" else "no answer came"
        report.add("G8", "unanswered", e.t,
                   f"{e.client} -> shard {e.shard}: {e.what} (rid {e.rid}, sent at"
                   f" {e.sent:.3f}): {how}, though no fault touched the link")
