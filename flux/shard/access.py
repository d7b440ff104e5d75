"""Who may do what on this shard (G13): HELLO's identity, per-item checks, reloads.

With ``auth`` on, a session proves an identity in HELLO (a token or the router's
session token, :mod:`flux.auth.identity`); until then it gets ``NotAuthorized`` for
everything but HELLO and PING. A failed HELLO closes the connection after its typed
ERROR. Each item is checked against the identity's permissions (cached decisions).
A reload keeps sessions whose identity still exists; their subscriptions that are
no longer allowed end with ``NotAuthorized``; sessions whose identity is gone close.
"""

from __future__ import annotations

from typing import Any

from flux import errors
from flux.auth import identity as identities
from flux.auth.users import AuthConfig
from flux.hashing import dead_letter_source
from flux.shard.state import P, Session, ShardState

# frames a session may send before its HELLO proved who it is
BEFORE_HELLO = frozenset({P.HELLO, P.PING})


class Access(ShardState):
    """Authentication and permission checks of the shard core."""

    def _authenticate(self, session: Session, body: dict[str, Any], now: float) -> None:
        """Set ``session.identity`` from a HELLO body (with auth on); raises
        AuthenticationFailed or SessionExpired when it proves none."""
        if self.auth is not None:
            session.identity = identities.fast(self.auth, self.secret, body, self.epoch + now,
                                               session.certificate)

    def _not_yet(self, kind: int) -> errors.NotAuthorized:
        return errors.NotAuthorized(
            f"{P.KIND_NAMES.get(kind, str(kind))} before HELLO: this broker requires a HELLO"
            " with credentials first")

    def _visible(self, session: Session) -> Any:
        """Which topics STATS shows ``session``: a predicate, or None for all."""
        identity = session.identity
        if identity is None or identity.permissions.broker_admin:
            return None
        return identity.permissions.may_see

    def reload_auth(self, auth: AuthConfig, now: float) -> None:
        """Apply a reloaded ``auth`` section (SIGHUP at the router) to every session."""
        self.auth = auth if auth.enabled else None
        for session in list(self.sessions.values()):
            if session.close or not session.hello:
                continue
            old = session.identity
            if self.auth is None:
                session.identity = None
                continue
            new = identities.refresh(self.auth, old) if old is not None else None
            if new is None:
                self._close_session(session, errors.AuthenticationFailed(
                    f"user {old.user!r} was removed or its credential changed (auth reloaded)"
                    if old is not None else "auth was turned on: reconnect with credentials"),
                    now)
                continue
            session.identity = new
            for sid, sub in list(session.subs.items()):
                # (a dead-letter topic is read with its source's permissions, G11)
                source = dead_letter_source(sub.topic)
                if not sub.attached_as(session.conn, sid) or new.permissions.may(
                        "subscribe", source or sub.topic) or (
                        source is not None and new.permissions.may("admin", source)):
                    continue
                session.out.append([P.SUB_ENDED, sid, errors.NotAuthorized.code,
                                    f"user {new.user!r} may no longer subscribe to topic"
                                    f" {sub.topic!r} (auth reloaded)"])
                self._emit("not_authorized", sub.topic, sub.name, (session.conn, sid))
                self._detach_sid(sub, session.conn, sid, now)
