"""TLS for the clients: which context a ``connect`` uses, from its URL and options.

``flux+tls://host:port`` (or ``tls=True``) verifies the broker with the system's CAs;
``tls="ca.pem"`` or ``?ca=ca.pem`` in the URL trusts that CA file instead; a client
certificate (mutual TLS) comes from ``?cert=...&key=...`` or an ``ssl.SSLContext``
passed as ``tls`` (used as it is). No sockets here: the shells wrap their streams.
"""

from __future__ import annotations

import ssl
from urllib.parse import parse_qs, urlsplit

TlsOption = bool | str | ssl.SSLContext | None


def client_context(url: str, tls: TlsOption = None, *, ca: str | None = None,
                   cert: str | None = None, key: str | None = None) -> ssl.SSLContext | None:
    """The context of every connection of a client to ``url``, or None for plain TCP.

    Raises ValueError for ``tls=False`` with a ``flux+tls://`` URL, and OSError or
    ``ssl.SSLError`` when a file cannot be loaded.
    """
    if isinstance(tls, ssl.SSLContext):
        return tls
    parts = urlsplit(url) if "://" in url else None
    query = parse_qs(parts.query) if parts is not None else {}
    ca = ca or (tls if isinstance(tls, str) else None) or _last(query, "ca")
    cert = cert or _last(query, "cert")
    key = key or _last(query, "key")
    wanted = (parts is not None and parts.scheme == "flux+tls") or tls is True \
        or isinstance(tls, str) or bool(ca or cert)
    if tls is False:
        if wanted and parts is not None and parts.scheme == "flux+tls":
            raise ValueError("tls=False contradicts the flux+tls:// URL")
        return None
    if not wanted:
        return None
    context = ssl.create_default_context(cafile=ca)
    if cert is not None:
        context.load_cert_chain(cert, key)
    return context


def _last(query: dict[str, list[str]], name: str) -> str | None:
    values = query.get(name)
    return values[-1] if values else None
