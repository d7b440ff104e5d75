"""How the router and its shards prove to each other that they belong to one broker.

Every broker has a secret: random bytes the router draws at its first start and
keeps in its runtime state (so a restarted router can still adopt its shards);
shards get it from the launcher, never on a command line. A control connection
opens with the listener's CHALLENGE nonce; the dialler answers with its own nonce
and an HMAC-SHA256 over both nonces and what it asks for; the listener answers
with an HMAC over the nonces in the other order. The secret never travels, and a
proof is bound to its connection's nonces, so a recorded one cannot be replayed.
Lives here: the secret, nonces, proofs and their checks; no sockets.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Any

import msgpack

from flux.host import Host

SECRET_BYTES = 32
NONCE_BYTES = 16

# what each proof vouches for: one label per step, so a proof of one step is never
# accepted for another
REGISTER = b"flux register"      # shard -> router: I am this shard (REGISTER's fields)
REGISTERED = b"flux registered"  # router -> shard: I am the router (REGISTERED, refusing DRAIN)
ADOPT = b"flux adopt"            # router -> shard: register at this control address
ADOPTED = b"flux adopted"        # shard -> router: I took it

# REGISTER fields a proof covers, in this order
REGISTER_FIELDS = ("index", "pid", "generation", "shard_count", "address", "advertise",
                   "control")


def new_secret(host: Host) -> str:
    """A new broker secret, as hex (it is kept in JSON state and handed to shards)."""
    return host.token_bytes(SECRET_BYTES).hex()


def valid_secret(value: Any) -> bool:
    """Whether ``value`` looks like a broker secret made by :func:`new_secret`."""
    if not isinstance(value, str) or len(value) != 2 * SECRET_BYTES:
        return False
    try:
        bytes.fromhex(value)
    except ValueError:
        return False
    return True


def new_nonce(host: Host) -> bytes:
    """A fresh challenge nonce (one per control connection and side)."""
    return host.token_bytes(NONCE_BYTES)


def prove(secret: str, label: bytes, *parts: bytes) -> bytes:
    """The HMAC-SHA256 of ``label`` and ``parts`` under ``secret``.

    Each part goes in with its length, so no two different lists of parts hash the
    same bytes.
    """
    mac = hmac.new(bytes.fromhex(secret), label, hashlib.sha256)
    for part in parts:
        mac.update(len(part).to_bytes(4, "big"))
        mac.update(part)
    return mac.digest()


def check(secret: str, proof: Any, label: bytes, *parts: bytes) -> bool:
    """Whether ``proof`` is :func:`prove`'s answer (in constant time); False for any
    value that is not bytes."""
    if not isinstance(proof, bytes) or not secret:
        return False
    return hmac.compare_digest(proof, prove(secret, label, *parts))


def nonce_of(body: dict[str, Any]) -> bytes | None:
    """The ``nonce`` field of a control frame's body, if it is one."""
    nonce = body.get("nonce")
    return nonce if isinstance(nonce, bytes) and len(nonce) == NONCE_BYTES else None


def register_fields(body: dict[str, Any]) -> bytes:
    """The REGISTER fields a proof covers, as one canonical byte string."""
    packed: bytes = msgpack.packb([body.get(k) for k in REGISTER_FIELDS], use_bin_type=True)
    return packed
