"""Permissions: allow and deny topic patterns per operation, and the decisions they give.

An operation is ``publish``, ``subscribe`` (SUBSCRIBE, FETCH, COMMIT) or ``admin``.
Patterns are the config's (``orders.*`` one token, ``orders.>`` one or more). A deny
that matches wins; else an allow that matches allows; with no match the answer is no.
Decisions are cached per topic, so a busy connection pays one dict lookup per item.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Final

from flux.policies import check_pattern, matches

OPERATIONS: Final = ("publish", "subscribe", "admin")
CACHE_LIMIT: Final = 10_000   # topics one decision cache remembers before it starts over


@dataclasses.dataclass(frozen=True)
class Rule:
    """The allow and deny patterns of one operation (as written, and as tokens)."""

    allow: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()

    @classmethod
    def parse(cls, raw: Any) -> Rule:
        """A rule from config data: ``{allow: [...], deny: [...]}`` or a list (allows);
        ValueError saying what is wrong."""
        if raw is None:
            return cls()
        if isinstance(raw, list):
            raw = {"allow": raw}
        if not isinstance(raw, dict):
            raise ValueError(f"expected {{allow: [...], deny: [...]}}, got {raw!r}")
        unknown = sorted(set(raw) - {"allow", "deny"}, key=str)
        if unknown:
            raise ValueError(f"unknown key {unknown[0]!r} (allow, deny)")
        lists: dict[str, tuple[str, ...]] = {}
        for key in ("allow", "deny"):
            value = raw.get(key) or []
            if not isinstance(value, list):
                raise ValueError(f"{key}: expected a list of topic patterns, got {value!r}")
            lists[key] = tuple(check_pattern(p) for p in value)
        return cls(**lists)

    def to_dict(self) -> dict[str, list[str]]:
        return {"allow": list(self.allow), "deny": list(self.deny)}

    def decide(self, topic: str) -> bool:
        """Whether this rule allows ``topic`` (deny wins; no match: no)."""
        tokens = topic.split(".")
        if any(matches(p.split("."), tokens) for p in self.deny):
            return False
        return any(matches(p.split("."), tokens) for p in self.allow)

    @property
    def covers_all(self) -> bool:
        """Whether it allows every topic: ``>`` allowed and nothing denied."""
        return ">" in self.allow and not self.deny


class Permissions:
    """One user's rules, with a decision cache per operation.

    ``everything`` is the broker's own identity (the router's monitor): all allowed.
    """

    __slots__ = ("_cache", "rules")

    def __init__(self, publish: Rule = Rule(), subscribe: Rule = Rule(), admin: Rule = Rule()
                 ) -> None:
        self.rules = {"publish": publish, "subscribe": subscribe, "admin": admin}
        self._cache: dict[str, dict[str, bool]] = {op: {} for op in OPERATIONS}

    @classmethod
    def everything(cls) -> Permissions:
        every = Rule(allow=(">",))
        return cls(every, every, every)

    def may(self, operation: str, topic: str) -> bool:
        """Whether ``operation`` on ``topic`` is allowed (a valid topic name)."""
        cache = self._cache[operation]
        decision = cache.get(topic)
        if decision is None:
            if len(cache) >= CACHE_LIMIT:
                cache.clear()
            decision = cache[topic] = self.rules[operation].decide(topic)
        return decision

    def may_see(self, topic: str) -> bool:
        """Whether STATS shows ``topic`` to this user (any operation allowed on it)."""
        return any(self.may(op, topic) for op in OPERATIONS)

    @property
    def broker_admin(self) -> bool:
        """Admin over every topic: router STATS and the HTTP endpoints need this."""
        return self.rules["admin"].covers_all
