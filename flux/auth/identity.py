"""Identities: who a connection proved to be in its HELLO, and what it may do.

HELLO's body carries one credential: ``token`` (a string, checked by its SHA-256),
``session`` (bytes from the router's login, :mod:`flux.auth.sessions`) or ``user`` and
``password`` (the router only: :mod:`flux.auth.login`). Everything here is fast; the
shards and the router share it. :func:`refresh` re-resolves an identity after a reload.
"""

from __future__ import annotations

import dataclasses
import hmac
from typing import Any

from flux import errors
from flux.auth import sessions
from flux.auth.credentials import token_digest
from flux.auth.permissions import Permissions
from flux.auth.users import AuthConfig

MAX_CREDENTIAL_CHARS = 1024


@dataclasses.dataclass(frozen=True, slots=True)
class Identity:
    """A proven user and its permissions (under the auth config that proved it)."""

    user: str
    permissions: Permissions
    fingerprint: bytes


_BROKER = Identity(sessions.BROKER, Permissions.everything(), b"")


def credential_kind(body: dict[str, Any]) -> str | None:
    """Which credential a HELLO body carries: "token", "session", "password" or None."""
    for kind in ("token", "session", "password"):
        if body.get(kind) is not None:
            return kind
    return None


def from_token(auth: AuthConfig, token: Any) -> Identity:
    """The user a token belongs to; AuthenticationFailed if none."""
    if not isinstance(token, str) or not 0 < len(token) <= MAX_CREDENTIAL_CHARS:
        raise errors.AuthenticationFailed("the token must be a non-empty string")
    user = auth.by_token.get(token_digest(token))
    if user is None:
        raise errors.AuthenticationFailed("unknown token")
    return Identity(user.name, auth.permissions[user.name], user.fingerprint)


def from_session(auth: AuthConfig, secret: str, token: Any, wall_now: float) -> Identity:
    """The user a session token names, if it still exists with the same credential."""
    name, fingerprint = sessions.read(secret, token, wall_now)
    if name == sessions.BROKER:
        return _BROKER
    user = auth.by_name.get(name)
    if user is None or not hmac.compare_digest(user.fingerprint, fingerprint):
        raise errors.AuthenticationFailed(
            f"user {name!r} is gone or its credential changed: log in again")
    return Identity(name, auth.permissions[name], fingerprint)


def fast(auth: AuthConfig, secret: str, body: dict[str, Any], wall_now: float,
         certificate: str | None = None) -> Identity:
    """The identity a HELLO body proves with a token or a session token, or else the
    connection's TLS client certificate (its common name, ``certificate``) does.

    Raises AuthenticationFailed (no credential, a wrong one, or a password: only the
    router checks those) or SessionExpired.
    """
    kind = credential_kind(body)
    if kind is None and certificate is not None:
        user = auth.by_certificate.get(certificate)
        if user is None:
            raise errors.AuthenticationFailed(
                f"no user has the client certificate {certificate!r}")
        return Identity(user.name, auth.permissions[user.name], user.fingerprint)
    if kind == "token":
        return from_token(auth, body["token"])
    if kind == "session":
        return from_session(auth, secret, body["session"], wall_now)
    if kind == "password":
        raise errors.AuthenticationFailed(
            "passwords are checked by the router only: send the session token its HELLO_OK"
            " gave")
    raise errors.AuthenticationFailed(
        "this broker requires credentials: HELLO with a token, or a user and password at"
        " the router")


def refresh(auth: AuthConfig, identity: Identity) -> Identity | None:
    """``identity`` under a reloaded ``auth``: its user with the new rules, or None when
    the user is gone or its credential changed."""
    if identity.user == sessions.BROKER:
        return identity
    user = auth.by_name.get(identity.user)
    if user is None or user.fingerprint != identity.fingerprint:
        return None
    return Identity(user.name, auth.permissions[user.name], identity.fingerprint)
