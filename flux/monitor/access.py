"""Who may read the HTTP endpoint (G13): with ``auth`` on, an admin of every topic.

Requests carry HTTP basic credentials (a user and password, checked like a login at
the router: rate-limited per address, the slow hash in a thread, then remembered
until the next reload so the dashboard's polling costs no hash) or
``Authorization: Bearer TOKEN``. Without them: 401; a user who is no admin of every
topic: 403. ``/healthz`` stays open (it says only whether the broker serves).
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from flux import errors
from flux.auth import identity as identities
from flux.auth.identity import Identity
from flux.auth.login import Logins
from flux.auth.users import AuthConfig

OPEN_PATHS = frozenset({"/healthz"})
MAX_REMEMBERED = 1000


class AdminOnly:
    """ASGI middleware: lets a request through only with an admin's credentials."""

    def __init__(self, app: ASGIApp, auth: Callable[[], AuthConfig], logins: Logins,
                 secret: Callable[[], str]) -> None:
        self.app = app
        self.auth = auth
        self.logins = logins
        self.secret = secret
        self._remembered: tuple[AuthConfig | None, dict[bytes, Identity]] = (None, {})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        auth = self.auth()
        if scope["type"] != "http" or not auth.enabled or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        try:
            identity = await self._identify(auth, request)
        except (errors.AuthenticationFailed, errors.TooManyLogins) as exc:
            await _refuse(401, exc)(scope, receive, send)
            return
        if not identity.permissions.broker_admin:
            await _refuse(403, errors.NotAuthorized(
                f"user {identity.user!r} is no admin of every topic (admin: allow ['>'])"))(
                    scope, receive, send)
            return
        await self.app(scope, receive, send)

    async def _identify(self, auth: AuthConfig, request: Request) -> Identity:
        header = request.headers.get("authorization", "")
        scheme, _, value = header.partition(" ")
        if scheme.lower() == "bearer" and value:
            return identities.from_token(auth, value.strip())
        if scheme.lower() != "basic" or not value:
            raise errors.AuthenticationFailed("this endpoint needs an admin's credentials"
                                              " (HTTP basic, or a bearer token)")
        try:
            user, sep, password = base64.b64decode(value.strip()).decode("utf-8").partition(":")
        except (ValueError, UnicodeDecodeError):
            raise errors.AuthenticationFailed("malformed basic credentials") from None
        if not sep:
            raise errors.AuthenticationFailed("malformed basic credentials")
        config, known = self._remembered
        if config is not auth:  # a reload forgets every remembered login
            config, known = auth, {}
            self._remembered = (config, known)
        key = hashlib.sha256(f"{user}\0{password}".encode()).digest()
        identity = known.get(key)
        if identity is None:
            address = request.client.host if request.client is not None else "?"
            identity, _ = await self.logins.login(auth, self.secret(),
                                                  {"user": user, "password": password}, address)
            if len(known) >= MAX_REMEMBERED:
                known.clear()
            known[key] = identity
        return identity


def _refuse(status: int, exc: errors.FluxError) -> Response:
    headers: dict[str, Any] = {"WWW-Authenticate": 'Basic realm="flux"'} if status == 401 else {}
    return JSONResponse({"error": type(exc).__name__, "message": str(exc)}, status_code=status,
                        headers=headers)
