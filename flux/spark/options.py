"""The options of the ``flux`` Spark data source, parsed once and checked early.

Spark hands options over as a case-insensitive map of strings; the dataclasses
here turn them into typed values (raising ValueError naming the bad option) and
pickle as plain data. No pyspark and no I/O here.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import xxhash

from flux import errors, protocol
from flux.client.credentials import Credentials, split_url
from flux.spark import offsets

DEFAULT_URL = "flux://127.0.0.1:7070"
DEFAULT_TIMEOUT = 60.0

_Get = Callable[[str], "str | None"]


@dataclass(frozen=True)
class SourceOptions:
    """Options of ``spark.readStream.format("flux")`` and ``spark.read.format("flux")``."""

    url: str
    topics: list[str]
    subscription: str
    starting_offsets: str | None
    ending_offsets: str | None
    max_messages_per_trigger: int | None
    max_messages_per_partition: int
    min_partitions: int
    fail_on_data_loss: bool
    timeout: float
    # token, or user and password (auth, G13); ca, cert, key: TLS files (tlsCa, ...)
    credentials: dict[str, str]

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SourceOptions:
        """Raises ValueError naming the option that is missing or malformed."""
        get = _getter(options)
        topics = offsets.parse_topics(get("topics"))
        subscription = get("subscription") or default_subscription(topics)
        if len(subscription.encode()) > 255 or subscription.startswith("~"):
            raise ValueError("option 'subscription': 1-255 bytes, not starting with '~'")
        opts = cls(
            url=get("url") or DEFAULT_URL,
            topics=topics,
            subscription=subscription,
            starting_offsets=get("startingOffsets"),
            ending_offsets=get("endingOffsets"),
            max_messages_per_trigger=_int(get, "maxMessagesPerTrigger", None),
            max_messages_per_partition=_int(get, "maxMessagesPerPartition", 10_000) or 10_000,
            min_partitions=_int(get, "minPartitions", 1) or 1,
            fail_on_data_loss=_bool(get, "failOnDataLoss", True),
            timeout=_float(get, "timeout", DEFAULT_TIMEOUT),
            credentials=_credentials(get),
        )
        # fail at query definition, not in the middle of a batch
        offsets.parse_starting(opts.starting_offsets, topics)
        offsets.parse_starting(opts.ending_offsets, topics, option="endingOffsets")
        protocol.parse_address(split_url(opts.url)[0])
        return opts


@dataclass(frozen=True)
class SinkOptions:
    """Options of ``df.writeStream.format("flux")`` and ``df.write.format("flux")``."""

    url: str
    topic: str | None
    batch_size: int
    write_id: str
    timeout: float
    # token, or user and password (auth, G13); ca, cert, key: TLS files (tlsCa, ...)
    credentials: dict[str, str]

    @classmethod
    def parse(cls, options: Mapping[str, str], columns: list[str]) -> SinkOptions:
        """Raises ValueError when a column or option is missing or malformed."""
        get = _getter(options)
        topic = get("topic")
        if topic is not None:
            try:
                protocol.check_topic(topic)
            except errors.InvalidTopic as exc:
                raise ValueError(f"option 'topic': {exc}") from None
        if "payload" not in columns:
            raise ValueError(f"the flux sink needs a 'payload' column (binary or string);"
                             f" the DataFrame has {', '.join(columns) or 'no columns'}")
        if topic is None and "topic" not in columns:
            raise ValueError("the flux sink needs option 'topic' or a 'topic' column")
        write_id = get("writeId") or os.urandom(8).hex()
        opts = cls(url=get("url") or DEFAULT_URL, topic=topic,
                   batch_size=_int(get, "batchSize", 500) or 500, write_id=write_id,
                   timeout=_float(get, "timeout", DEFAULT_TIMEOUT), credentials=_credentials(get))
        protocol.parse_address(split_url(opts.url)[0])
        return opts


def _credentials(get: _Get) -> dict[str, str]:
    """Options ``token``, or ``user`` and ``password``, and the TLS files ``tlsCa``,
    ``tlsCert``, ``tlsKey`` (as ``ca``, ``cert``, ``key``); ValueError for a wrong mix."""
    found = {key: value for key in ("token", "user", "password") if (value := get(key))}
    try:
        Credentials(**found)
    except ValueError as exc:
        raise ValueError(f"options 'token', 'user', 'password': {exc}") from None
    for option, key in (("tlsCa", "ca"), ("tlsCert", "cert"), ("tlsKey", "key")):
        value = get(option)
        if value:
            found[key] = value
    return found


def default_subscription(topics: list[str]) -> str:
    """The pull subscription name used when the ``subscription`` option is not set.

    Derived from the topics so that a restarted query finds its subscription
    again; two queries reading the same topics must each set their own.
    """
    return "spark-" + xxhash.xxh3_64_hexdigest(",".join(sorted(topics)).encode())[:12]


def _getter(options: Mapping[str, str]) -> _Get:
    lowered = {str(k).lower(): v for k, v in options.items()}

    def get(key: str) -> str | None:
        value = lowered.get(key.lower())
        return None if value is None else str(value)

    return get


def _int(get: _Get, key: str, default: int | None) -> int | None:
    value = get(key)
    if value is None:
        return default
    try:
        number = int(value)
    except ValueError:
        raise ValueError(f"option {key!r}: expected an integer, got {value!r}") from None
    if number < 1:
        raise ValueError(f"option {key!r}: must be at least 1, got {number}")
    return number


def _float(get: _Get, key: str, default: float) -> float:
    value = get(key)
    if value is None:
        return default
    try:
        number = float(value)
    except ValueError:
        raise ValueError(f"option {key!r}: expected a number of seconds, got {value!r}") from None
    if not number > 0:
        raise ValueError(f"option {key!r}: must be positive, got {number}")
    return number


def _bool(get: _Get, key: str, default: bool) -> bool:
    value = get(key)
    if value is None:
        return default
    if value.strip().lower() in ("true", "1", "yes"):
        return True
    if value.strip().lower() in ("false", "0", "no"):
        return False
    raise ValueError(f"option {key!r}: expected true or false, got {value!r}")
