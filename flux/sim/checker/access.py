"""Checks on who may do what (G13): with ``auth`` on, nothing a client's user may not
do is accepted (stored, delivered, read, committed), and nothing it may do is refused
with NotAuthorized. The rules come from the run's config (``meta["config"]["auth"]``),
each client's user from ``meta["logins"]``. The checker judges them with a matcher of
its own (patterns as regular expressions), not the shards' code, so a bug there
cannot hide itself."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from flux.sim import history as h
from flux.sim.checker import Report
from flux.sim.checker.index import Index

# outcomes that say nothing about permissions: the request did not reach a decision
UNDECIDED = frozenset({"ConnectionLost", "RequestTimeout", "RetryDeadlineExceeded",
                       "ShuttingDown", "WrongShard", "Busy", "ClientClosed", "SessionExpired",
                       "TooManyLogins", "AuthenticationFailed"})
# the operation each attempt needs
NEEDS = {"publish": "publish", "subscribe": "subscribe", "fetch": "subscribe",
         "commit": "subscribe"}


def check(index: Index, report: Report) -> None:
    meta = index.history.meta
    users = {u["name"]: u for u in (meta.get("config", {}).get("auth") or {}).get("users", [])}
    if not users:
        return
    logins: dict[str, str] = meta.get("logins", {})

    def may(client: str, operation: str, topic: str) -> bool:
        user = users.get(logins.get(client, logins.get("*", "")))
        return user is not None and _allows(user.get(operation), topic)

    def accepted(t: float, client: str, operation: str, topic: str, what: str) -> None:
        report.examine("G13", "unauthorized-accepted")
        if not may(client, operation, topic):
            report.add("G13", "unauthorized-accepted", t,
                       f"{client} (user {logins.get(client, logins.get('*'))!r}) may not"
                       f" {operation} on {topic!r}, yet {what}")

    for e in index.history:
        if isinstance(e, h.PublishAcked):
            accepted(e.t, e.producer, "publish", e.topic,
                     f"its publish of {e.id!r} was stored at offset {e.offset}")
        elif isinstance(e, h.Delivered):
            accepted(e.t, e.subscriber.split("/", 1)[0], "subscribe", e.topic,
                     f"offset {e.offset} was delivered to it")
        elif isinstance(e, h.Subscribed):
            accepted(e.t, e.client, "subscribe", e.topic, "its SUBSCRIBE was answered")
        elif isinstance(e, h.Fetched):
            accepted(e.t, e.client, "subscribe", e.topic, "its FETCH was answered")
        elif isinstance(e, h.Committed):
            accepted(e.t, e.client, "subscribe", e.topic, "its COMMIT was applied")
        elif isinstance(e, h.PublishFailed) and e.error == "NotAuthorized":
            _refused(report, e.t, e.producer, "publish", e.topic, may)
        elif isinstance(e, h.PullRefused) and e.error == "NotAuthorized":
            _refused(report, e.t, e.client, "subscribe", e.topic, may)
        elif isinstance(e, h.AuthChecked):
            _attempt(report, e, may(e.client, NEEDS[e.operation], e.topic))


def _allows(rule: Any, topic: str) -> bool:
    """A rule's answer for ``topic`` (deny wins; no match: no), by regular expressions."""
    if not rule:
        return False
    if isinstance(rule, list):
        rule = {"allow": rule}
    if any(_regex(p).fullmatch(topic) for p in rule.get("deny") or []):
        return False
    return any(_regex(p).fullmatch(topic) for p in rule.get("allow") or [])


def _regex(pattern: str) -> re.Pattern[str]:
    """``*`` one token, a final ``>`` one or more."""
    parts = pattern.split(".")
    tail = r"[^.]+(?:\.[^.]+)*" if parts[-1] == ">" else None
    if tail is not None:
        parts = parts[:-1]
    tokens = ["[^.]+" if p == "*" else re.escape(p) for p in parts]
    if tail is not None:
        tokens.append(tail)
    return re.compile(r"\.".join(tokens))


def _refused(report: Report, t: float, client: str, operation: str, topic: str,
             may: Callable[[str, str, str], bool]) -> None:
    report.examine("G13", "wrongly-refused")
    if may(client, operation, topic):
        report.add("G13", "wrongly-refused", t,
                   f"{client} may {operation} on {topic!r}, yet was refused NotAuthorized")


def _attempt(report: Report, e: h.AuthChecked, allowed: bool) -> None:
    """An intruder's attempt: refused with NotAuthorized exactly when not allowed (an
    attempt that never reached a decision, cut by a fault, says nothing)."""
    if e.outcome in UNDECIDED:
        return
    if allowed:
        report.examine("G13", "wrongly-refused")
        if e.outcome == "NotAuthorized":
            report.add("G13", "wrongly-refused", e.t,
                       f"{e.client} may {e.operation} on {e.topic!r}, yet was refused"
                       " NotAuthorized")
    else:
        report.examine("G13", "unauthorized-accepted")
        if e.outcome != "NotAuthorized":
            report.add("G13", "unauthorized-accepted", e.t,
                       f"{e.client} may not {e.operation} on {e.topic!r}, yet the broker"
                       f" answered {e.outcome} (not NotAuthorized)")
