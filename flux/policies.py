"""Topic policies: per-pattern settings from the config's ``topics:`` list.

A pattern is topic tokens where ``*`` stands for exactly one token and a final
``>`` for one or more. :func:`resolve` gives a topic its :class:`TopicSettings`:
the first matching policy's keys over the global ones. Validation of the values
lives in :mod:`flux.config`; the shard and the simulator's checker both resolve
through here, so they can never disagree on which policy a topic gets.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from typing import Any, Final

# The per-topic keys (their config paths) and the TopicSettings field each sets.
POLICY_KEYS: Final[dict[str, str]] = {
    "message.ttl": "ttl",
    "message.dedup_window": "dedup_window",
    "message.max_delay": "max_delay",
    "topic.max_bytes": "max_bytes",
    "subscriber.retry_count": "retry_count",
    "subscriber.retry_interval": "retry_interval",
    "subscriber.timeout": "timeout",
    "subscriber.inactive_time": "inactive_time",
    "storage.kind": "storage",
    "storage.max_bytes": "storage_max_bytes",
    "dead_letter.enabled": "dead_letter",
    "dead_letter.ttl": "dead_letter_ttl",
}

# Per-topic keys DESIGN.md names for features not built yet, and what brings each.
PLANNED_KEYS: Final[dict[str, str]] = {}

MAX_PATTERN_BYTES: Final = 255
_TOKEN = re.compile(r"[A-Za-z0-9_-]+\Z")


@dataclasses.dataclass(frozen=True, slots=True)
class TopicSettings:
    """What one topic uses: its policy's keys over the global ones.

    ``match`` is the pattern of the policy that matched, ``None`` when none did
    (every value is then the global one).
    """

    match: str | None
    ttl: float
    dedup_window: float
    max_bytes: int
    retry_count: int
    retry_interval: float
    timeout: float
    inactive_time: float
    storage: str = "memory"          # "memory" or "disk" (G9), fixed when the topic is made
    storage_max_bytes: int = 0       # a disk topic's log size cap; 0: only the disk's room
    max_delay: float = 2592000.0     # the longest delay a publish may ask for (G12)
    # G11: exhausted and termed messages go to the subscription's dead-letter topic,
    # which holds them this long whether or not anyone reads them
    dead_letter: bool = False
    dead_letter_ttl: float = 604800.0

    def as_dict(self) -> dict[str, Any]:
        """``{"match": ..., "message.ttl": ..., ...}``: config paths, as STATS reports them."""
        values: dict[str, Any] = {"match": self.match}
        for path, name in POLICY_KEYS.items():
            values[path] = getattr(self, name)
        return values


@dataclasses.dataclass(frozen=True)
class TopicPolicy:
    """One entry of ``topics:``: a pattern and the (validated) keys it sets."""

    match: str
    values: tuple[tuple[str, Any], ...] = ()  # (config path, value), as written

    @property
    def tokens(self) -> tuple[str, ...]:
        return tuple(self.match.split("."))

    def to_dict(self) -> dict[str, Any]:
        """The entry as the config file writes it: ``{"match": ..., "message": {...}}``."""
        data: dict[str, Any] = {"match": self.match}
        for path, value in self.values:
            section, key = path.split(".")
            data.setdefault(section, {})[key] = value
        storage = data.get("storage")
        if storage is not None and list(storage) == ["kind"]:
            data["storage"] = storage["kind"]  # written as the config file has it: storage: disk
        dead_letter = data.get("dead_letter")
        if dead_letter is not None and list(dead_letter) == ["enabled"]:
            data["dead_letter"] = dead_letter["enabled"]  # dead_letter: true
        return data

    def apply(self, base: TopicSettings) -> TopicSettings:
        """``base`` with this policy's keys (and its pattern as ``match``)."""
        changes = {POLICY_KEYS[path]: value for path, value in self.values}
        return dataclasses.replace(base, match=self.match, **changes)


def storage_defaults(settings: TopicSettings, policy: TopicPolicy | None, *,
                     inactive_time: float, disk_inactive_time: float) -> TopicSettings:
    """``settings`` with the defaults that depend on the topic's storage, for the keys
    ``policy`` (None: the global settings) does not set: a disk topic keeps inactive
    subscriptions ``disk_inactive_time`` (``storage.inactive_time``, G9), a memory topic
    ``inactive_time`` (``subscriber.inactive_time``)."""
    if policy is not None and any(path == "subscriber.inactive_time" for path, _ in policy.values):
        return settings
    value = disk_inactive_time if settings.storage == "disk" else inactive_time
    return settings if value == settings.inactive_time else dataclasses.replace(
        settings, inactive_time=value)


def dead_letter_settings(base: TopicSettings, source: TopicSettings) -> TopicSettings:
    """The settings of a dead-letter topic (G11): the global ones (``base``: it matches
    no user policy) with its source topic's storage, held for the source's
    ``dead_letter.ttl``, and never dead-lettering itself."""
    return dataclasses.replace(base, match=None, storage=source.storage,
                               ttl=source.dead_letter_ttl, dead_letter=False)


def check_pattern(pattern: object) -> str:
    """Return ``pattern`` if it is a valid topic pattern, else raise ValueError saying why."""
    if not isinstance(pattern, str):
        raise ValueError(f"expected a topic pattern, got {pattern!r}")
    size = len(pattern.encode("utf-8", "surrogatepass"))
    if not 1 <= size <= MAX_PATTERN_BYTES:
        raise ValueError(f"a pattern is 1-{MAX_PATTERN_BYTES} bytes, got {size}")
    tokens = pattern.split(".")
    for i, token in enumerate(tokens):
        if token == ">":
            if i != len(tokens) - 1:
                raise ValueError(f"bad pattern {pattern!r}: '>' may only be the last token")
        elif token != "*" and not _TOKEN.match(token):
            raise ValueError(
                f"bad pattern {pattern!r}: use tokens of [A-Za-z0-9_-] separated by single"
                " dots, '*' for exactly one token and a final '>' for one or more")
    return pattern


def matches(pattern: Sequence[str], topic: Sequence[str]) -> bool:
    """Whether a topic's tokens match a pattern's (``*`` one token, final ``>`` one or more)."""
    if pattern and pattern[-1] == ">":
        fixed = len(pattern) - 1
        if len(topic) <= fixed:
            return False
    elif len(topic) != len(pattern):
        return False
    else:
        fixed = len(pattern)
    return all(p == "*" or p == t for p, t in zip(pattern[:fixed], topic, strict=False))


def resolve(policies: Sequence[tuple[tuple[str, ...], TopicSettings]], topic: str,
            base: TopicSettings) -> TopicSettings:
    """The settings of ``topic``: those of the first policy whose pattern (tokens) matches,
    else ``base`` (the global ones). ``policies`` pairs each pattern with its settings,
    already applied over ``base`` (see ``Config.policies``)."""
    if not policies:
        return base
    tokens = topic.split(".")
    for pattern, settings in policies:
        if matches(pattern, tokens):
            return settings
    return base
