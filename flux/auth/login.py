"""The router's password login: rate-limited per address, the slow hash off the loop.

Each address may cause ``auth.logins_per_minute`` password checks in any 60 s; one
more gets ``TooManyLogins`` without a check. The check (scrypt) runs through the
host's ``run_slow`` (a worker thread in production). A good password is answered
with a session token (:mod:`flux.auth.sessions`) for the shards.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from flux import errors
from flux.auth import sessions
from flux.auth.credentials import verify_password
from flux.auth.identity import MAX_CREDENTIAL_CHARS, Identity
from flux.auth.users import AuthConfig
from flux.host import Host

WINDOW = 60.0
MAX_ADDRESSES = 100_000   # addresses remembered at once (the oldest are forgotten past it)


class Logins:
    """Password checks of one router: who tried when, and the checks themselves."""

    def __init__(self, host: Host) -> None:
        self.host = host
        self._tries: dict[str, deque[float]] = {}

    def _admit(self, address: str, limit: int, now: float) -> None:
        tries = self._tries.get(address)
        if tries is None:
            if len(self._tries) >= MAX_ADDRESSES:
                self._forget(now)
            tries = self._tries[address] = deque()
        while tries and tries[0] <= now - WINDOW:
            tries.popleft()
        if len(tries) >= limit:
            wait = tries[0] + WINDOW - now
            raise errors.TooManyLogins(
                f"{limit} password logins from {address} in the last minute"
                f" (auth.logins_per_minute); retry in {wait:.0f}s")
        tries.append(now)

    def _forget(self, now: float) -> None:
        for address in [a for a, t in self._tries.items() if not t or t[-1] <= now - WINDOW]:
            del self._tries[address]
        while len(self._tries) >= MAX_ADDRESSES:  # all recent: forget in insertion order
            del self._tries[next(iter(self._tries))]

    async def login(self, auth: AuthConfig, secret: str, body: dict[str, Any],
                    address: str) -> tuple[Identity, bytes]:
        """Check ``body``'s user and password; the identity and a session token for it.

        Raises TooManyLogins (the address's rate is used up) or AuthenticationFailed.
        """
        name, password = body.get("user"), body.get("password")
        if not isinstance(name, str) or not isinstance(password, str) \
                or len(password) > MAX_CREDENTIAL_CHARS:
            raise errors.AuthenticationFailed("a password login needs 'user' and 'password'"
                                              " strings")
        self._admit(address, auth.logins_per_minute, self.host.now())
        user = auth.by_name.get(name)
        # an unknown user costs the same check, so timing does not tell who exists
        stored = user.password if user is not None and user.password else _DECOY
        good = await self.host.run_slow(verify_password, password, stored)
        if not good or user is None or user.password is None:
            raise errors.AuthenticationFailed(f"wrong user or password for {name!r}")
        expires = self.host.wall_time() + auth.session_ttl
        token = sessions.issue(secret, user.name, user.fingerprint, expires)
        return Identity(user.name, auth.permissions[user.name], user.fingerprint), token


# a fixed hash no password matches (its salt and digest are arbitrary)
_DECOY = "scrypt$16384$8$1$ZGVjb3lkZWNveWRlY295AA==$" + "A" * 43 + "="
