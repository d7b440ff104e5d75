"""Broker configuration: the YAML schema of DESIGN.md §2, its defaults and validation.

:func:`load` reads a file, applies ``--set key.path=value`` overrides and flags,
and refuses unknown keys or bad values with :class:`~flux.errors.ConfigError`
naming the key's path. The README's config reference mirrors :data:`DEFAULTS`.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from flux.auth.users import DEFAULTS as AUTH_DEFAULTS
from flux.auth.users import AuthConfig, parse_auth
from flux.errors import ConfigError
from flux.hashing import dead_letter_source
from flux.policies import (
    PLANNED_KEYS,
    POLICY_KEYS,
    TopicPolicy,
    TopicSettings,
    check_pattern,
    dead_letter_settings,
    resolve,
    storage_defaults,
)

DEFAULTS: dict[str, Any] = {
    "port": 7070,
    "host": "127.0.0.1",
    "shards": "auto",
    "max_frame_bytes": 8388608,
    "limits": {"max_connections": 10000, "hello_timeout": 5.0, "max_subscriptions": 10000,
               "max_output_bytes": 16777216},
    "topic": {"buffer": 1024, "max_bytes": 268435456},
    "message": {"ttl": 60.0, "cleanup_time": 5.0, "dedup_window": 120.0, "max_delay": 2592000.0},
    "subscriber": {
        "retry_count": 5,
        "retry_interval": 1.0,
        "cleanup_time": 10.0,
        "timeout": 30.0,
        "inactive_time": 300.0,
        "heartbeat": 5.0,
        "max_in_flight": 1000,
    },
    "router": {"control_port": 0, "adopt_window": 5.0},
    "shard": {"ports": "auto", "advertise": [], "orphan_timeout": 60.0, "max_memory": "auto"},
    "storage": {"kind": "memory", "dir": None, "fsync": "always", "fsync_interval": 1.0,
                "segment_bytes": 67108864, "max_bytes": 0, "cache_bytes": 67108864,
                "reserved_bytes": 67108864, "inactive_time": 604800.0,
                "compaction_rate": 33554432},
    "http": {"enabled": True, "host": "127.0.0.1", "port": "auto", "stats_interval": 2.0},
    "tls": {"cert": None, "key": None, "client_ca": None},
    "dead_letter": {"enabled": False, "ttl": 604800.0},
    "topics": [],
    "auth": copy.deepcopy(AUTH_DEFAULTS),
}

FSYNC_MODES = ("always", "interval", "never")


@dataclasses.dataclass(frozen=True)
class LimitsConfig:
    """What one client may cost a router or shard (DESIGN.md G8, "Why a connection may
    close")."""

    max_connections: int = 10000      # client connections per router and per shard
    hello_timeout: float = 5.0        # seconds a connection has to send HELLO
    max_subscriptions: int = 10000    # push subscriptions attached to one session
    max_output_bytes: int = 16777216  # unsent bytes one connection may hold (see README)


@dataclasses.dataclass(frozen=True)
class TopicConfig:
    buffer: int = 1024
    max_bytes: int = 268435456


@dataclasses.dataclass(frozen=True)
class MessageConfig:
    ttl: float = 60.0
    cleanup_time: float = 5.0
    dedup_window: float = 120.0
    max_delay: float = 2592000.0  # 30 days: the longest delay= a publish may ask for (G12)


@dataclasses.dataclass(frozen=True)
class SubscriberConfig:
    retry_count: int = 5
    retry_interval: float = 1.0
    cleanup_time: float = 10.0
    timeout: float = 30.0
    inactive_time: float = 300.0
    heartbeat: float = 5.0
    max_in_flight: int = 1000


@dataclasses.dataclass(frozen=True)
class DeadLetterConfig:
    """Dead-letter topics (G11): whether exhausted and termed messages go to one, and
    how long it holds them (7 days)."""

    enabled: bool = False
    ttl: float = 604800.0


@dataclasses.dataclass(frozen=True)
class RouterConfig:
    control_port: int = 0
    adopt_window: float = 5.0


@dataclasses.dataclass(frozen=True)
class ShardConfig:
    ports: str | tuple[int, ...] = "auto"
    advertise: tuple[str, ...] = ()
    orphan_timeout: float = 60.0
    max_memory: int | str = "auto"


@dataclasses.dataclass(frozen=True)
class StorageConfig:
    """Where and how disk topics keep their logs (DESIGN.md G9)."""

    kind: str = "memory"            # the storage of topics no policy gives one
    dir: str | None = None          # the data directory; required for any disk topic
    fsync: str = "always"           # always | interval | never
    fsync_interval: float = 1.0     # seconds between fsyncs with ``interval``
    segment_bytes: int = 67108864   # a log segment is rolled past this size
    max_bytes: int = 0              # a disk topic's log size cap (0: the disk's room)
    cache_bytes: int = 67108864     # disk topics' payloads a shard keeps in memory once durable
    reserved_bytes: int = 67108864  # free disk kept for acks, commits and compaction
    inactive_time: float = 604800.0  # disk topics' subscriber.inactive_time (7 days)
    compaction_rate: int = 33554432  # bytes of sealed segments a shard compacts a second (0: no cap)


@dataclasses.dataclass(frozen=True)
class HttpConfig:
    """The router's monitoring endpoint (``/metrics``, ``/healthz``, ``/api/``, the dashboard)."""

    enabled: bool = True
    host: str = "127.0.0.1"
    port: int | str = "auto"      # "auto": port + HTTP_PORT_OFFSET, or any free port
    stats_interval: float = 2.0   # seconds between two gatherings of every shard's STATS


@dataclasses.dataclass(frozen=True)
class TlsConfig:
    """TLS on the router's public port and every shard's client port (see flux.tls)."""

    cert: str | None = None       # PEM certificate chain; with key, the ports speak TLS
    key: str | None = None        # PEM private key (None: in the cert file)
    client_ca: str | None = None  # PEM CAs: clients must present a certificate they signed

    @property
    def enabled(self) -> bool:
        return self.cert is not None

    def to_dict(self) -> dict[str, str | None]:
        """The section as the config file spells it (read back by :func:`parse_tls`)."""
        return {"cert": self.cert, "key": self.key, "client_ca": self.client_ca}


HTTP_PORT_OFFSET = 1000  # http.port "auto" with the default port 7070 is 8070


@dataclasses.dataclass(frozen=True)
class Config:
    """The whole validated configuration (immutable)."""

    port: int = 7070
    host: str = "127.0.0.1"
    shards: int | str = "auto"
    max_frame_bytes: int = 8388608
    limits: LimitsConfig = LimitsConfig()
    topic: TopicConfig = TopicConfig()
    message: MessageConfig = MessageConfig()
    subscriber: SubscriberConfig = SubscriberConfig()
    router: RouterConfig = RouterConfig()
    shard: ShardConfig = ShardConfig()
    storage: StorageConfig = StorageConfig()
    http: HttpConfig = HttpConfig()
    tls: TlsConfig = TlsConfig()
    dead_letter: DeadLetterConfig = DeadLetterConfig()
    topics: tuple[TopicPolicy, ...] = ()  # per-pattern settings; the first match wins
    # users and permissions (G13); off without users
    auth: AuthConfig = dataclasses.field(default_factory=AuthConfig)

    @functools.cached_property
    def plain_settings(self) -> TopicSettings:
        """The per-topic keys' global values as written, before storage-dependent defaults."""
        m, s = self.message, self.subscriber
        return TopicSettings(match=None, ttl=m.ttl, dedup_window=m.dedup_window,
                             max_delay=m.max_delay,
                             max_bytes=self.topic.max_bytes, retry_count=s.retry_count,
                             retry_interval=s.retry_interval, timeout=s.timeout,
                             inactive_time=s.inactive_time, storage=self.storage.kind,
                             storage_max_bytes=self.storage.max_bytes,
                             dead_letter=self.dead_letter.enabled,
                             dead_letter_ttl=self.dead_letter.ttl)

    @functools.cached_property
    def global_settings(self) -> TopicSettings:
        """The per-topic keys' global values: what a topic no policy matches uses."""
        return self._by_storage(self.plain_settings, None)

    def _by_storage(self, settings: TopicSettings, policy: TopicPolicy | None) -> TopicSettings:
        return storage_defaults(settings, policy, inactive_time=self.subscriber.inactive_time,
                                disk_inactive_time=self.storage.inactive_time)

    @functools.cached_property
    def policies(self) -> tuple[tuple[tuple[str, ...], TopicSettings], ...]:
        """Each policy's pattern tokens with its settings applied over the global ones."""
        base = self.global_settings
        return tuple((policy.tokens, self._by_storage(policy.apply(base), policy))
                     for policy in self.topics)

    def settings_for(self, topic: str) -> TopicSettings:
        """The settings of ``topic``: the first matching policy over the global keys.
        Resolve once per topic, not per message (it splits the name and tries each
        pattern in turn). A dead-letter topic (G11) matches no user policy: it takes
        the global keys with its source topic's storage and ``dead_letter.ttl``."""
        source = dead_letter_source(topic)
        if source is not None:
            return self._by_storage(dead_letter_settings(
                self.plain_settings, resolve(self.policies, source, self.global_settings)),
                None)
        return resolve(self.policies, topic, self.global_settings)

    @property
    def shard_count(self) -> int:
        """The number of shard processes: ``shards``, or the usable CPUs for ``auto``."""
        if isinstance(self.shards, int):
            return self.shards
        return usable_cpus()

    @property
    def http_port(self) -> int:
        """The port of the HTTP endpoint: ``http.port``, or for ``auto`` ``port`` + 1000
        (any free port when ``port`` is 0 or that sum is no port)."""
        if isinstance(self.http.port, int):
            return self.http.port
        if self.port == 0 or self.port + HTTP_PORT_OFFSET > 65535:
            return 0
        return self.port + HTTP_PORT_OFFSET

    def shard_max_memory(self, shard_count: int) -> int:
        """``shard.max_memory`` in bytes: as set, or for ``auto`` half the machine's
        memory shared by ``shard_count`` shards."""
        if isinstance(self.shard.max_memory, int):
            return self.shard.max_memory
        return max(1 << 26, physical_memory() // 2 // max(1, shard_count))

    def to_dict(self) -> dict[str, Any]:
        """The configuration as plain data (round-trips through :func:`from_dict`)."""
        data = dataclasses.asdict(self)
        data["shard"]["advertise"] = list(self.shard.advertise)
        if not isinstance(self.shard.ports, str):
            data["shard"]["ports"] = list(self.shard.ports)
        data["topics"] = [policy.to_dict() for policy in self.topics]
        data["auth"] = self.auth.to_dict()
        return data

    def replace(self, changes: Mapping[str, Any] | None = None, /, **overrides: Any) -> Config:
        """A copy with dotted-path overrides applied: ``replace({"message.ttl": 5})``
        (or ``replace(port=0)``). Raises ConfigError for unknown keys or bad values."""
        data = self.to_dict()
        for path, value in {**(changes or {}), **overrides}.items():
            _set_path(data, path, value)
        return from_dict(data)


def usable_cpus() -> int:
    """CPUs this process may run on (``os.sched_getaffinity`` where available)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def physical_memory() -> int:
    """The machine's memory in bytes (8 GiB where the platform does not tell)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, ValueError, OSError):
        return 8 << 30


# -- validation ------------------------------------------------------------------------


def _positive_number(path: str, value: Any, *, allow_zero: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(path, f"expected a number of seconds, got {value!r}")
    if not math.isfinite(value):
        raise ConfigError(path, f"must be a finite number of seconds, got {value!r}")
    if value < 0 or (value == 0 and not allow_zero):
        raise ConfigError(path, f"must be {'>= 0' if allow_zero else '> 0'}, got {value!r}")
    return float(value)


def _int(path: str, value: Any, *, minimum: int = 0, maximum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(path, f"expected an integer, got {value!r}")
    if value < minimum or (maximum is not None and value > maximum):
        upper = f" and <= {maximum}" if maximum is not None else ""
        raise ConfigError(path, f"must be >= {minimum}{upper}, got {value}")
    return value


def _port(path: str, value: Any) -> int:
    return _int(path, value, minimum=0, maximum=65535)


def _check_keys(path: str, data: Any, allowed: dict[str, Any]) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise ConfigError(path or "(root)", f"expected a mapping, got {data!r}")
    for key in data:
        if key not in allowed:
            where = f"{path}.{key}" if path else str(key)
            known = ", ".join(sorted(allowed))
            raise ConfigError(where, f"unknown key (known keys here: {known})")
    return data


def _seconds(path: str, value: Any) -> float:
    return _positive_number(path, value)


def _seconds_or_zero(path: str, value: Any) -> float:
    return _positive_number(path, value, allow_zero=True)


def _count(path: str, value: Any) -> int:
    return _int(path, value)


def _bytes(path: str, value: Any) -> int:
    return _int(path, value, minimum=1)


# How each per-topic key is checked: the same check for the global key and in a policy.
_POLICY_CHECKS: dict[str, Callable[[str, Any], Any]] = {
    "message.ttl": _seconds_or_zero,
    "message.dedup_window": _seconds_or_zero,
    "message.max_delay": _seconds_or_zero,
    "topic.max_bytes": _bytes,
    "subscriber.retry_count": _count,
    "subscriber.retry_interval": _seconds_or_zero,
    "subscriber.timeout": _seconds,
    "subscriber.inactive_time": _seconds_or_zero,
    "storage.kind": lambda path, value: _storage_kind(path, value),
    "storage.max_bytes": lambda path, value: _int(path, value, minimum=0),
    "dead_letter.enabled": lambda path, value: _flag(path, value),
    "dead_letter.ttl": _seconds_or_zero,
}
assert _POLICY_CHECKS.keys() == POLICY_KEYS.keys()
_POLICY_SECTIONS = frozenset(path.split(".")[0] for path in POLICY_KEYS)


def _flag(path: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(path, f"expected true or false, got {value!r}")
    return value


def _storage_kind(path: str, value: Any) -> str:
    if value not in ("memory", "disk"):
        raise ConfigError(path, f"expected 'memory' or 'disk', got {value!r}")
    return str(value)


def _check_policy_key(where: str, path: str) -> None:
    """Refuse a key a policy may not set (``where``: the policy's path)."""
    if path in POLICY_KEYS:
        return
    planned = PLANNED_KEYS.get(path)
    if planned is not None:
        raise ConfigError(f"{where}.{path}", f"not accepted yet: it arrives with {planned}")
    known = ", ".join(POLICY_KEYS)
    if "." in path and _known_path(path):
        raise ConfigError(f"{where}.{path}",
                          f"a global key only, not per topic (per-topic keys: {known})")
    raise ConfigError(f"{where}.{path}", f"unknown key (per-topic keys: {known})")


def _known_path(path: str) -> bool:
    node: Any = DEFAULTS
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def _topic_policies(raw: Any) -> tuple[TopicPolicy, ...]:
    """Validate the ``topics:`` list (paths in errors: ``topics[2].message.ttl``)."""
    if raw is None:  # "topics:" with nothing under it
        return ()
    if not isinstance(raw, list):
        raise ConfigError("topics", f"expected a list of {{match: PATTERN, ...}}, got {raw!r}")
    policies: list[TopicPolicy] = []
    seen: dict[str, int] = {}
    for i, entry in enumerate(raw):
        where = f"topics[{i}]"
        if not isinstance(entry, dict):
            raise ConfigError(where, "expected a mapping like {match: 'orders.*', message:"
                                     f" {{ttl: 300}}}}, got {entry!r}")
        if "match" not in entry:
            raise ConfigError(f"{where}.match",
                              "missing: a policy names the topics it applies to")
        try:
            pattern = check_pattern(entry["match"])
        except ValueError as exc:
            raise ConfigError(f"{where}.match", str(exc)) from None
        if pattern in seen:
            raise ConfigError(f"{where}.match",
                              f"{pattern!r} is topics[{seen[pattern]}]'s pattern too; the"
                              " first match wins, so this policy would never apply")
        seen[pattern] = i
        values: list[tuple[str, Any]] = []
        for section, keys in entry.items():
            if section == "match":
                continue
            if section == "storage" and not isinstance(keys, dict):
                keys = {"kind": keys}  # storage: disk is short for storage: {kind: disk}
            if section == "dead_letter" and not isinstance(keys, dict):
                keys = {"enabled": keys}  # dead_letter: true, short for {enabled: true}
            if section not in _POLICY_SECTIONS:
                _check_policy_key(where, str(section))  # raises: it is not a section of them
            if not isinstance(keys, dict):
                raise ConfigError(f"{where}.{section}", f"expected a mapping, got {keys!r}")
            for key, value in keys.items():
                path = f"{section}.{key}"
                _check_policy_key(where, path)
                values.append((path, _POLICY_CHECKS[path](f"{where}.{path}", value)))
        policies.append(TopicPolicy(pattern, tuple(values)))
    return tuple(policies)


def _limits(raw: dict[str, Any], max_frame_bytes: int) -> LimitsConfig:
    """Validate the ``limits`` section (its output cap must hold two whole frames)."""
    output = _int("limits.max_output_bytes", raw["max_output_bytes"], minimum=1)
    if output < 2 * max_frame_bytes:
        raise ConfigError("limits.max_output_bytes",
                          f"must hold two whole frames: at least 2 x max_frame_bytes ="
                          f" {2 * max_frame_bytes}, got {output}")
    return LimitsConfig(
        max_connections=_int("limits.max_connections", raw["max_connections"], minimum=1),
        hello_timeout=_positive_number("limits.hello_timeout", raw["hello_timeout"]),
        max_subscriptions=_int("limits.max_subscriptions", raw["max_subscriptions"], minimum=1),
        max_output_bytes=output,
    )


def from_dict(raw: dict[str, Any]) -> Config:
    """Validate plain data (missing keys take defaults) and build a :class:`Config`."""
    if isinstance(raw, dict) and isinstance(raw.get("dead_letter"), bool):
        raw = {**raw, "dead_letter": {"enabled": raw["dead_letter"]}}  # dead_letter: true
    data = _check_keys("", raw, DEFAULTS)
    merged = copy.deepcopy(DEFAULTS)
    for key, value in data.items():
        if isinstance(DEFAULTS[key], dict):
            merged[key].update(_check_keys(key, value, DEFAULTS[key]))
        else:
            merged[key] = value

    shards = merged["shards"]
    if shards != "auto":
        shards = _int("shards", shards, minimum=1, maximum=1024)
    host = merged["host"]
    if not isinstance(host, str) or not host:
        raise ConfigError("host", f"expected a host name or address, got {host!r}")

    t, m, s, r, sh, st = (merged[k] for k in ("topic", "message", "subscriber", "router",
                                              "shard", "storage"))
    data_dir = st["dir"]
    if data_dir is not None and (not isinstance(data_dir, str) or not data_dir):
        raise ConfigError("storage.dir", f"expected a directory path, got {data_dir!r}")
    if st["fsync"] not in FSYNC_MODES:
        raise ConfigError("storage.fsync",
                          f"expected one of {', '.join(FSYNC_MODES)}, got {st['fsync']!r}")
    ports = sh["ports"]
    if ports != "auto":
        if not isinstance(ports, list) or not ports:
            raise ConfigError("shard.ports", f"expected 'auto' or a list of ports, got {ports!r}")
        ports = tuple(_port(f"shard.ports[{i}]", p) for i, p in enumerate(ports))
    max_memory = sh["max_memory"]
    if max_memory != "auto":
        if isinstance(max_memory, bool) or not isinstance(max_memory, int):
            raise ConfigError("shard.max_memory",
                              f"expected 'auto' or a number of bytes, got {max_memory!r}")
        max_memory = _int("shard.max_memory", max_memory, minimum=1)
    advertise = sh["advertise"]
    if not isinstance(advertise, list):
        raise ConfigError("shard.advertise", f"expected a list of host:port, got {advertise!r}")
    for i, a in enumerate(advertise):
        port = a.rsplit(":", 1)[1] if isinstance(a, str) and ":" in a else ""
        if not (port.isascii() and port.isdigit() and int(port) <= 65535):
            raise ConfigError(f"shard.advertise[{i}]", f"expected host:port, got {a!r}")
    if isinstance(shards, int):
        if ports != "auto" and len(ports) != shards:
            raise ConfigError("shard.ports", f"has {len(ports)} ports for {shards} shards")
        if advertise and len(advertise) != shards:
            raise ConfigError("shard.advertise", f"has {len(advertise)} addresses for {shards} shards")

    max_frame_bytes = _int("max_frame_bytes", merged["max_frame_bytes"], minimum=1024)
    config = Config(
        port=_port("port", merged["port"]),
        host=host,
        shards=shards,
        max_frame_bytes=max_frame_bytes,
        limits=_limits(merged["limits"], max_frame_bytes),
        topic=TopicConfig(
            buffer=_int("topic.buffer", t["buffer"], minimum=1),
            max_bytes=_bytes("topic.max_bytes", t["max_bytes"]),
        ),
        message=MessageConfig(
            ttl=_seconds_or_zero("message.ttl", m["ttl"]),
            cleanup_time=_positive_number("message.cleanup_time", m["cleanup_time"]),
            dedup_window=_seconds_or_zero("message.dedup_window", m["dedup_window"]),
            max_delay=_seconds_or_zero("message.max_delay", m["max_delay"]),
        ),
        subscriber=SubscriberConfig(
            retry_count=_count("subscriber.retry_count", s["retry_count"]),
            retry_interval=_seconds_or_zero("subscriber.retry_interval", s["retry_interval"]),
            cleanup_time=_positive_number("subscriber.cleanup_time", s["cleanup_time"]),
            timeout=_seconds("subscriber.timeout", s["timeout"]),
            inactive_time=_seconds_or_zero("subscriber.inactive_time", s["inactive_time"]),
            heartbeat=_positive_number("subscriber.heartbeat", s["heartbeat"]),
            max_in_flight=_int("subscriber.max_in_flight", s["max_in_flight"], minimum=1),
        ),
        router=RouterConfig(
            control_port=_port("router.control_port", r["control_port"]),
            adopt_window=_positive_number("router.adopt_window", r["adopt_window"],
                                          allow_zero=True),
        ),
        shard=ShardConfig(
            ports=ports,
            advertise=tuple(advertise),
            orphan_timeout=_positive_number("shard.orphan_timeout", sh["orphan_timeout"]),
            max_memory=max_memory,
        ),
        storage=StorageConfig(
            kind=_storage_kind("storage.kind", st["kind"]),
            dir=data_dir,
            fsync=st["fsync"],
            fsync_interval=_seconds("storage.fsync_interval", st["fsync_interval"]),
            segment_bytes=_int("storage.segment_bytes", st["segment_bytes"], minimum=4096),
            max_bytes=_int("storage.max_bytes", st["max_bytes"], minimum=0),
            cache_bytes=_int("storage.cache_bytes", st["cache_bytes"], minimum=0),
            reserved_bytes=_int("storage.reserved_bytes", st["reserved_bytes"], minimum=0),
            inactive_time=_seconds_or_zero("storage.inactive_time", st["inactive_time"]),
            compaction_rate=_int("storage.compaction_rate", st["compaction_rate"], minimum=0),
        ),
        http=_http(merged["http"]),
        tls=_tls(merged["tls"]),
        dead_letter=DeadLetterConfig(
            enabled=_flag("dead_letter.enabled", merged["dead_letter"]["enabled"]),
            ttl=_seconds_or_zero("dead_letter.ttl", merged["dead_letter"]["ttl"])),
        topics=_topic_policies(merged["topics"]),
        auth=parse_auth(merged["auth"]),
    )
    if data_dir is None and (config.storage.kind == "disk" or any(
            dict(policy.values).get("storage.kind") == "disk" for policy in config.topics)):
        raise ConfigError("storage.dir", "disk topics need a data directory: set storage.dir"
                                         " or start with --data-dir DIR")
    return config


def _http(raw: dict[str, Any]) -> HttpConfig:
    enabled = raw["enabled"]
    if not isinstance(enabled, bool):
        raise ConfigError("http.enabled", f"expected true or false, got {enabled!r}")
    host = raw["host"]
    if not isinstance(host, str) or not host:
        raise ConfigError("http.host", f"expected a host name or address, got {host!r}")
    port = raw["port"]
    if port != "auto":
        if isinstance(port, str):
            raise ConfigError("http.port", f"expected 'auto' or a port number, got {port!r}")
        port = _port("http.port", port)
    return HttpConfig(enabled=enabled, host=host, port=port,
                      stats_interval=_positive_number("http.stats_interval",
                                                      raw["stats_interval"]))


def parse_tls(raw: Any) -> TlsConfig:
    """A ``tls`` section (as :meth:`TlsConfig.to_dict` writes it); ConfigError if bad."""
    if not isinstance(raw, dict) or set(raw) - {"cert", "key", "client_ca"}:
        raise ConfigError("tls", f"expected a map of cert, key and client_ca, got {raw!r}")
    return _tls({"cert": None, "key": None, "client_ca": None, **raw})


def _tls(raw: dict[str, Any]) -> TlsConfig:
    paths: dict[str, str | None] = {}
    for key in ("cert", "key", "client_ca"):
        value = raw[key]
        if value is not None and (not isinstance(value, str) or not value):
            raise ConfigError(f"tls.{key}", f"expected the path of a PEM file, got {value!r}")
        paths[key] = value
    if paths["cert"] is None and (paths["key"] is not None or paths["client_ca"] is not None):
        raise ConfigError("tls.cert", "tls.key and tls.client_ca need tls.cert (the server's"
                                      " certificate)")
    return TlsConfig(**paths)


def _set_path(data: dict[str, Any], path: str, value: Any) -> None:
    parts = path.split(".")
    node: Any = data
    for i, part in enumerate(parts[:-1]):
        if not isinstance(node, dict) or part not in node or not isinstance(node[part], dict):
            raise ConfigError(".".join(parts[: i + 1]), "unknown section")
        node = node[part]
    if not isinstance(node, dict):
        raise ConfigError(path, "unknown key")
    node[parts[-1]] = value


def parse_override(text: str) -> tuple[str, Any]:
    """Parse ``key.path=value`` (the value is read as a YAML scalar or list)."""
    path, sep, raw = text.partition("=")
    if not sep or not path.strip():
        raise ConfigError(text, "expected key.path=value")
    import yaml  # (here: a shard process takes its config as a dict and never needs it)

    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        raise ConfigError(path.strip(), f"cannot parse value {raw!r}: {exc}") from None
    return path.strip(), value


def load(path: str | Path | None = None, overrides: list[str] | None = None,
         **flags: Any) -> Config:
    """Read ``path`` (optional), then apply ``--set`` overrides, then flags (``None`` skipped)."""
    data: dict[str, Any] = {}
    if path is not None:
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise ConfigError(str(path), f"cannot read: {exc.strerror}") from None
        import yaml

        try:
            loaded = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ConfigError(str(path), f"invalid YAML: {exc}") from None
        if loaded is not None:
            data = _check_keys("", loaded, DEFAULTS)
    merged = copy.deepcopy(DEFAULTS)
    for key, value in data.items():
        if isinstance(DEFAULTS[key], dict) and isinstance(value, dict):
            _check_keys(key, value, DEFAULTS[key])
            merged[key].update(value)
        else:
            merged[key] = value
    for item in overrides or []:
        key, value = parse_override(item)
        _check_path_known(key)
        _set_path(merged, key, value)
    for key, value in flags.items():
        if value is not None:
            _set_path(merged, key, value)
    return from_dict(merged)


def _check_path_known(path: str) -> None:
    node: Any = DEFAULTS
    for i, part in enumerate(path.split(".")):
        if not isinstance(node, dict) or part not in node:
            raise ConfigError(".".join(path.split(".")[: i + 1]), "unknown key")
        node = node[part]
