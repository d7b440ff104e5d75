"""Session tokens: what the router gives a user who logged in with a password.

A session token is ``payload + mac``: the payload is MessagePack ``[1, user,
expires, fingerprint]`` (``expires`` in wall-clock seconds, the fingerprint of the
user's credential), the mac its HMAC-SHA256 under the broker secret
(:func:`flux.control_proof.prove`). A shard checks one in microseconds, so a
reconnect storm never runs a password hash on a shard. The user ``""`` is the broker
itself (the router's monitor), allowed everything.
"""

from __future__ import annotations

from typing import Any

import msgpack

from flux import control_proof, errors

LABEL = b"flux session"
MAC_BYTES = 32
BROKER = ""   # the user name of the broker's own connections
MAX_TOKEN_BYTES = 512


def issue(secret: str, user: str, fingerprint: bytes, expires: float) -> bytes:
    """A session token for ``user`` valid until wall time ``expires``."""
    payload: bytes = msgpack.packb([1, user, float(expires), fingerprint], use_bin_type=True)
    return payload + control_proof.prove(secret, LABEL, payload)


def read(secret: str, token: Any, wall_now: float) -> tuple[str, bytes]:
    """The user and fingerprint a valid, unexpired session token names.

    Raises AuthenticationFailed for anything not signed with ``secret``, and
    SessionExpired past its expiry.
    """
    if not isinstance(token, bytes) or not MAC_BYTES < len(token) <= MAX_TOKEN_BYTES:
        raise errors.AuthenticationFailed("the session token is malformed")
    payload, mac = token[:-MAC_BYTES], token[-MAC_BYTES:]
    if not control_proof.check(secret, mac, LABEL, payload):
        raise errors.AuthenticationFailed(
            "the session token is not one this broker issued (log in at the router again)")
    try:
        version, user, expires, fingerprint = msgpack.unpackb(payload, raw=False)
    except (ValueError, TypeError, msgpack.UnpackException):
        raise errors.AuthenticationFailed("the session token is malformed") from None
    if version != 1 or not isinstance(user, str) or not isinstance(fingerprint, bytes) \
            or not isinstance(expires, float):
        raise errors.AuthenticationFailed("the session token is malformed")
    if wall_now >= expires:
        raise errors.SessionExpired("the session token expired (auth.session_ttl): log in"
                                    " at the router again")
    return user, fingerprint
