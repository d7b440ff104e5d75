"""What a client proves itself with (DESIGN.md G13): a token, or a user and password.

A URL may carry them: ``flux://USER:PASSWORD@host:port`` or
``flux://host:port?token=TOKEN`` (percent-encoded); keyword arguments of ``connect``
win over the URL. A token goes in every HELLO; a password only to the router, which
answers with a session token that later HELLOs (the shards', and the router's
until it expires) carry instead.
"""

from __future__ import annotations

import dataclasses
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit


@dataclasses.dataclass(frozen=True, repr=False)
class Credentials:
    """A token, or a user and password (never shown by ``repr``)."""

    token: str | None = None
    user: str | None = None
    password: str | None = None

    def __post_init__(self) -> None:
        if self.token is not None and (self.user is not None or self.password is not None):
            raise ValueError("give a token or a user and password, not both")
        if (self.user is None) != (self.password is None):
            raise ValueError("a user needs a password, and a password a user")
        for name in ("token", "user", "password"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"{name} must be a non-empty string")

    def __repr__(self) -> str:
        return f"Credentials(user={self.user!r})" if self.user else "Credentials(token=...)"

    def hello(self, role: str, session: bytes | None) -> dict[str, Any]:
        """The credential fields of a HELLO to the router or a shard."""
        if self.token is not None:
            return {"token": self.token}
        if session is not None:  # the router too: a password costs it a slow hash
            return {"session": session}
        if role == "router":
            return {"user": self.user, "password": self.password}
        return {}


def split_url(url: str, *, token: str | None = None, user: str | None = None,
              password: str | None = None) -> tuple[str, Credentials | None]:
    """``host:port`` of ``url`` and the credentials of the URL and the arguments (the
    arguments win). Raises ValueError for a URL it cannot read or mixed credentials."""
    address = url
    if "://" in url:
        parts = urlsplit(url)
        if parts.scheme not in ("flux", "flux+tls"):
            raise ValueError(f"unsupported URL scheme {parts.scheme!r} (use flux:// or"
                             " flux+tls://)")
        if parts.username is not None and user is None and token is None:
            user = unquote(parts.username)
            password = unquote(parts.password) if parts.password is not None else password
        query = parse_qs(parts.query)
        if "token" in query and token is None and user is None:
            token = query["token"][-1]
        address = parts.netloc.rpartition("@")[2]
    if token is None and user is None and password is None:
        return address, None
    return address, Credentials(token=token, user=user, password=password)
