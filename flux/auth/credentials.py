"""Stored credentials: a token's SHA-256, and a password's slow hash (scrypt).

A token is a long random string the operator hands out: it is kept only as its
SHA-256 (hex), which is cheap to check, so shards check tokens themselves. A
password is kept as ``scrypt$N$r$p$salt$hash`` (base64 salt and hash): checking one
costs tens of milliseconds and 16 MiB on purpose, so only the router does it.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os

SCRYPT_N = 1 << 14      # the standard interactive cost (about 50 ms, 16 MiB)
SCRYPT_R = 8
SCRYPT_P = 1
SALT_BYTES = 16
HASH_BYTES = 32
MAX_N = 1 << 20         # a config may not make one check cost more than this
MAX_MEMORY = 1 << 30


def token_digest(token: str) -> str:
    """The SHA-256 of a token, as the ``token_sha256`` of a user in the config (hex)."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def hash_password(password: str, *, n: int = SCRYPT_N, r: int = SCRYPT_R, p: int = SCRYPT_P,
                  salt: bytes | None = None) -> str:
    """A new stored form of ``password`` (a fresh random salt unless one is given)."""
    salt = os.urandom(SALT_BYTES) if salt is None else salt
    digest = _scrypt(password, salt, n, r, p)
    return "$".join(("scrypt", str(n), str(r), str(p), _b64(salt), _b64(digest)))


def check_stored(stored: str) -> str:
    """Return ``stored`` if it is a password hash this module made; ValueError saying why."""
    _parse(stored)
    return stored


def verify_password(password: str, stored: str) -> bool:
    """Whether ``password`` is the one ``stored`` was made from (slow: run it off the
    event loop). False for a malformed ``stored``."""
    try:
        n, r, p, salt, digest = _parse(stored)
    except ValueError:
        return False
    return hmac.compare_digest(_scrypt(password, salt, n, r, p), digest)


def _scrypt(password: str, salt: bytes, n: int, r: int, p: int) -> bytes:
    return hashlib.scrypt(password.encode("utf-8", "surrogatepass"), salt=salt, n=n, r=r,
                          p=p, dklen=HASH_BYTES, maxmem=MAX_MEMORY + (1 << 20))


def _parse(stored: str) -> tuple[int, int, int, bytes, bytes]:
    parts = stored.split("$") if isinstance(stored, str) else []
    if len(parts) != 6 or parts[0] != "scrypt":
        raise ValueError("expected scrypt$N$r$p$salt$hash (print one with 'flux auth hash')")
    try:
        n, r, p = int(parts[1]), int(parts[2]), int(parts[3])
        salt, digest = base64.b64decode(parts[4], validate=True), base64.b64decode(
            parts[5], validate=True)
    except ValueError:
        raise ValueError("a password hash's N, r, p must be numbers and its salt and hash"
                         " base64") from None
    if n < 2 or n & (n - 1) or n > MAX_N or not 1 <= r <= 64 or not 1 <= p <= 16:
        raise ValueError(f"scrypt parameters N={n} r={r} p={p} are out of range (N a power"
                         f" of two up to {MAX_N}, r 1-64, p 1-16)")
    if 128 * r * n > MAX_MEMORY:
        raise ValueError(f"scrypt N={n} r={r} needs more than {MAX_MEMORY} bytes")
    if len(digest) != HASH_BYTES or not salt:
        raise ValueError("a password hash needs a salt and a 32-byte hash")
    return n, r, p, salt, digest


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")
