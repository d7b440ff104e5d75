"""The config's ``auth`` section: users, their stored credentials and their rules.

Auth is on when ``auth.users`` lists anyone. Each user has a name, exactly one
credential (``token_sha256``; ``password``: a hash from ``flux auth hash``; or
``certificate``: the common name of a TLS client certificate ``tls.client_ca``
signed) and a rule per operation (:mod:`flux.auth.permissions`). Validation errors carry the key's
path, like every config error.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import re
from typing import Any, Final

from flux.auth.credentials import check_stored
from flux.auth.permissions import OPERATIONS, Permissions, Rule
from flux.errors import ConfigError

DEFAULTS: Final[dict[str, Any]] = {"users": [], "session_ttl": 600.0, "logins_per_minute": 30}
USER_KEYS: Final = ("name", "token_sha256", "password", "certificate", *OPERATIONS)
_NAME = re.compile(r"[A-Za-z0-9_.@-]{1,64}\Z")
_HEX64 = re.compile(r"[0-9a-f]{64}\Z")


@dataclasses.dataclass(frozen=True)
class User:
    """One user: a name, one stored credential, and a rule per operation."""

    name: str
    token_sha256: str | None = None
    password: str | None = None       # the stored hash, never the password
    certificate: str | None = None    # a TLS client certificate's common name
    publish: Rule = dataclasses.field(default_factory=Rule)
    subscribe: Rule = dataclasses.field(default_factory=Rule)
    admin: Rule = dataclasses.field(default_factory=Rule)

    @property
    def fingerprint(self) -> bytes:
        """8 bytes that change when the user's credential changes: a session token made
        before a password change no longer opens connections."""
        credential = self.token_sha256 or self.password or f"cn={self.certificate}"
        return hashlib.sha256(f"{self.name}\0{credential}".encode()).digest()[:8]

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"name": self.name}
        if self.token_sha256 is not None:
            data["token_sha256"] = self.token_sha256
        if self.password is not None:
            data["password"] = self.password
        if self.certificate is not None:
            data["certificate"] = self.certificate
        for op in OPERATIONS:
            data[op] = getattr(self, op).to_dict()
        return data


@dataclasses.dataclass(frozen=True)
class AuthConfig:
    """The validated ``auth`` section (immutable; a reload makes a new one)."""

    users: tuple[User, ...] = ()
    session_ttl: float = 600.0        # seconds a router session token opens connections
    logins_per_minute: int = 30       # password checks one address may cause per minute

    @property
    def enabled(self) -> bool:
        return bool(self.users)

    @functools.cached_property
    def by_name(self) -> dict[str, User]:
        return {u.name: u for u in self.users}

    @functools.cached_property
    def by_token(self) -> dict[str, User]:
        return {u.token_sha256: u for u in self.users if u.token_sha256 is not None}

    @functools.cached_property
    def by_certificate(self) -> dict[str, User]:
        return {u.certificate: u for u in self.users if u.certificate is not None}

    @functools.cached_property
    def permissions(self) -> dict[str, Permissions]:
        """Each user's permissions: one object (and decision cache) per user and config."""
        return {u.name: Permissions(u.publish, u.subscribe, u.admin) for u in self.users}

    def to_dict(self) -> dict[str, Any]:
        return {"users": [u.to_dict() for u in self.users], "session_ttl": self.session_ttl,
                "logins_per_minute": self.logins_per_minute}


def parse_auth(raw: Any) -> AuthConfig:
    """Validate the ``auth`` section (missing keys take their defaults)."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError("auth", f"expected a section, got {raw!r}")
    for key in raw:
        if key not in DEFAULTS:
            raise ConfigError(f"auth.{key}", "unknown key")
    data = {**DEFAULTS, **raw}
    ttl = data["session_ttl"]
    if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not ttl > 0:
        raise ConfigError("auth.session_ttl", f"expected a positive number of seconds,"
                                              f" got {ttl!r}")
    rate = data["logins_per_minute"]
    if isinstance(rate, bool) or not isinstance(rate, int) or rate < 1:
        raise ConfigError("auth.logins_per_minute", f"expected an integer >= 1, got {rate!r}")
    users_raw = data["users"]
    if not isinstance(users_raw, list):
        raise ConfigError("auth.users", f"expected a list of users, got {users_raw!r}")
    users = tuple(_user(f"auth.users[{i}]", u) for i, u in enumerate(users_raw))
    names = [u.name for u in users]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise ConfigError(f"auth.users[{i}].name", f"user {name!r} is listed twice")
    for key in ("token_sha256", "certificate"):
        values = [getattr(u, key) for u in users if getattr(u, key)]
        if len(set(values)) != len(values):
            raise ConfigError("auth.users", f"two users have the same {key}")
    return AuthConfig(users=users, session_ttl=float(ttl), logins_per_minute=rate)


def _user(path: str, raw: Any) -> User:
    if not isinstance(raw, dict):
        raise ConfigError(path, f"expected a user ({{name, token_sha256 | password, publish,"
                                f" subscribe, admin}}), got {raw!r}")
    for key in raw:
        if key not in USER_KEYS:
            raise ConfigError(f"{path}.{key}", f"unknown key ({', '.join(USER_KEYS)})")
    name = raw.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise ConfigError(f"{path}.name", f"expected 1-64 characters of [A-Za-z0-9_.@-],"
                                          f" got {name!r}")
    token, password, certificate = (raw.get(k) for k in ("token_sha256", "password",
                                                          "certificate"))
    if sum(v is not None for v in (token, password, certificate)) != 1:
        raise ConfigError(path, f"user {name!r} needs exactly one of token_sha256, password"
                                " and certificate")
    if certificate is not None and (not isinstance(certificate, str) or not certificate):
        raise ConfigError(f"{path}.certificate", "expected a certificate's common name")
    if token is not None and (not isinstance(token, str) or not _HEX64.match(token)):
        raise ConfigError(f"{path}.token_sha256", "expected 64 lowercase hex digits (the"
                                                  " token's SHA-256; 'flux auth token' prints"
                                                  " a token and its digest)")
    if password is not None:
        try:
            check_stored(password)
        except ValueError as exc:
            raise ConfigError(f"{path}.password", str(exc)) from None
    rules: dict[str, Rule] = {}
    for op in OPERATIONS:
        try:
            rules[op] = Rule.parse(raw.get(op))
        except ValueError as exc:
            raise ConfigError(f"{path}.{op}", str(exc)) from None
    return User(name=name, token_sha256=token, password=password, certificate=certificate,
                **rules)
