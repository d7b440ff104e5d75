"""A message's key, headers and due time: their rules and their wire columns.

Shared by broker and clients (PROTOCOL.md §6.4, §7, §6.9): the checks a key, a
header map and a delay must pass, the optional map of columns a PUBLISH group,
a DELIVER or a FETCHED carries them in, and :class:`Meta`, how a shard holds
them per stored run of messages. Nothing here touches a socket or a clock.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import repeat
from operator import is_not
from typing import Any, Final, NamedTuple

from flux import errors

MAX_KEY_BYTES: Final = 255
RESERVED_PREFIX: Final = "flux-"   # header names the broker keeps for itself
MAX_HEADERS: Final = 64            # names per message


def check_key(key: object) -> str:
    """Return ``key`` if it is a valid message key (1-255 bytes of UTF-8), else raise
    InvalidKey."""
    if not isinstance(key, str):
        raise errors.InvalidKey(f"a message key must be a string, not {type(key).__name__}")
    try:
        size = len(key.encode("utf-8"))
    except UnicodeEncodeError:
        raise errors.InvalidKey("a message key must be valid Unicode text") from None
    if not 1 <= size <= MAX_KEY_BYTES:
        raise errors.InvalidKey(f"a message key must be 1-{MAX_KEY_BYTES} bytes, got {size}")
    return key


def check_headers(headers: object) -> dict[str, str]:
    """Return ``headers`` if it is a map of str to str (at most MAX_HEADERS names, none
    starting ``flux-``), else raise InvalidHeaders."""
    if not isinstance(headers, dict):
        raise errors.InvalidHeaders(
            f"headers must be a map of str to str, not {type(headers).__name__}")
    if len(headers) > MAX_HEADERS:
        raise errors.InvalidHeaders(f"at most {MAX_HEADERS} headers per message, got {len(headers)}")
    for name, value in headers.items():
        if not isinstance(name, str) or not isinstance(value, str) or not name:
            raise errors.InvalidHeaders(
                f"headers must map non-empty str names to str values; got {name!r}: {value!r}")
        if name.lower().startswith(RESERVED_PREFIX):
            raise errors.InvalidHeaders(
                f"header name {name!r}: names beginning {RESERVED_PREFIX!r} are reserved"
                " for the broker")
        try:
            name.encode("utf-8")
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise errors.InvalidHeaders("header names and values must be valid Unicode text") \
                from None
    return headers


def check_time(value: object, what: str = "deliver_at") -> float:
    """Return ``value`` if it is a finite number (seconds), else raise InvalidDelay."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise errors.InvalidDelay(f"{what} must be a finite number of seconds, not {value!r}")
    return float(value)


def check_delay(delay: object, max_delay: float, what: str = "delay") -> float:
    """Return ``delay`` (seconds) if it is a finite number from 0 to ``max_delay``, else
    raise InvalidDelay."""
    delay = check_time(delay, what)
    if delay < 0:
        raise errors.InvalidDelay(f"{what} must be >= 0, got {delay!r}")
    if delay > max_delay:
        raise errors.InvalidDelay(
            f"{what} of {delay:g}s is over message.max_delay={max_delay:g}s for this topic")
    return float(delay)


def meta_size(key: str | None, headers: dict[str, str] | None) -> int:
    """The bytes a key and headers add to a message (they count toward its limits)."""
    size = len(key.encode()) if key is not None else 0
    if headers:
        size += sum(len(n.encode()) + len(v.encode()) for n, v in headers.items())
    return size


class Meta(NamedTuple):
    """Keys and headers of one stored run of messages (a chunk); a column is None when no
    message of the run has one; ``sizes`` are :func:`meta_size` of each. (A shard keeps
    due times apart, :mod:`flux.shard.due_index`.)"""

    keys: tuple[str | None, ...] | None
    headers: tuple[dict[str, str] | None, ...] | None
    sizes: tuple[int, ...]


def make_meta(keys: Sequence[str | None] | None, headers: Sequence[dict[str, str] | None] | None,
              count: int) -> Meta | None:
    """A run's :class:`Meta`, or None when it carries nothing (the usual case)."""
    if keys is not None and all(k is None for k in keys):
        keys = None
    if headers is not None and not any(headers):
        headers = None
    if keys is None and headers is None:
        return None
    sizes = tuple(meta_size(keys[i] if keys is not None else None,
                            headers[i] if headers is not None else None) for i in range(count))
    return Meta(tuple(keys) if keys is not None else None,
                tuple(headers) if headers is not None else None, sizes)


def columns(keys: list[str | None], headers: list[dict[str, str] | None],
            dues: list[float | None]) -> dict[str, Any] | None:
    """The optional trailing map of DELIVER and FETCHED: only the columns some message
    has a value in (None when none has any)."""
    out: dict[str, Any] = {}
    if any(map(is_not, keys, repeat(None))):  # (stops at the first key: keyed, the usual)
        out["keys"] = keys
    if any(headers):
        out["headers"] = headers
    if dues.count(None) < len(dues):
        out["due"] = dues
    return out or None


def columns_size(meta: dict[str, Any]) -> int:
    """Roughly what a DELIVER's trailing map adds to its size, with room to spare (twice
    its text): a keys column (str or None each) by its keys' bytes and a few a key, at C
    speed, the others (rarer) by their repr."""
    size = 0
    for name, column in meta.items():
        if name == "keys":
            size += 2 * (len("".join(filter(None, column)).encode()) + 4 * len(column))
        else:
            size += 2 * len(str(column))
    return size


def read_columns(extra: Any, count: int) -> tuple[list[Any], list[Any], list[Any]] | None:
    """The key, headers and due columns of a DELIVER's or FETCHED's trailing map (each a
    list of ``count``, None where a message has none); None when there is no map.
    ValueError for a map of another shape."""
    if extra is None:
        return None
    if not isinstance(extra, dict):
        raise ValueError("the trailing field must be a map of columns")
    out: list[list[Any]] = []
    for name in ("keys", "headers", "due"):
        column = extra.get(name)
        if column is None:
            column = [None] * count
        elif type(column) is not list or len(column) != count:
            raise ValueError(f"column {name!r} must be an array of {count}")
        out.append(column)
    return out[0], out[1], out[2]


def group_options(count: int, keys: Sequence[str | None] | None,
                  headers: Sequence[dict[str, str] | None] | dict[str, str] | None,
                  delay: object, deliver_at: object) -> tuple[dict[str, Any] | None, int]:
    """A client's PUBLISH group options (PROTOCOL.md §6.4) for ``count`` messages, checked
    here so bad input fails before anything is sent, and the bytes they add; (None, 0)
    when the messages carry none (the usual group, the fast path)."""
    options: dict[str, Any] = {}
    size = 0
    if keys is not None:
        keys = list(keys)
        if len(keys) != count:
            raise errors.InvalidRequest(f"{len(keys)} keys for {count} messages")
        for key in keys:
            if key is not None:
                size += len(check_key(key).encode())
        if any(k is not None for k in keys):
            options["keys"] = keys
    if headers is not None:
        column = [headers] * count if isinstance(headers, dict) else list(headers)
        if len(column) != count:
            raise errors.InvalidRequest(f"{len(column)} header maps for {count} messages")
        for item in column:
            if item is not None:
                size += meta_size(None, check_headers(item))
        if any(column):
            options["headers"] = [item or None for item in column]
    if delay is not None and deliver_at is not None:
        raise errors.InvalidDelay("give delay or deliver_at, not both")
    if delay is not None:
        # the shard checks message.max_delay (a topic policy); here only the type and sign
        check_delay(delay, math.inf)
        if delay:
            options["delay"] = float(delay)  # type: ignore[arg-type]
    if deliver_at is not None:
        options["deliver_at"] = check_time(deliver_at)
    return (options or None), size + 16 * len(options)
