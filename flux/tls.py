"""TLS on the client-facing ports (DESIGN.md G13): contexts, and accepting a connection.

A broker with ``tls.cert`` and ``tls.key`` speaks TLS on the router's public port and
every shard's client port (control listeners stay on loopback, proven by the broker
secret). With ``tls.client_ca`` every client must present a certificate that CA
signed (mutual TLS); its subject's common name can name a user (``auth``). A client
that speaks plain Flux to a TLS port gets a plain ERROR saying so before the close:
a TLS record starts with byte 0x16, which as a Flux length prefix would be a frame of
over 300 MB. Lives here: contexts and the server side of the handshake; no frames.
"""

from __future__ import annotations

import ssl
from typing import Any

import trio

from flux import errors, protocol
from flux.config import TlsConfig

TLS_RECORD = 0x16  # the first byte of a TLS handshake record
RECV_BYTES = 65536


def server_context(config: TlsConfig) -> ssl.SSLContext | None:
    """The context of the client-facing ports, or None without ``tls.cert``. Raises
    ConfigError when a file cannot be read or does not hold what it should."""
    if config.cert is None:
        return None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(config.cert, config.key)
    except (OSError, ssl.SSLError) as exc:
        raise errors.ConfigError("tls.cert", f"cannot load {config.cert} with key"
                                             f" {config.key}: {exc}") from None
    if config.client_ca is not None:
        try:
            context.load_verify_locations(cafile=config.client_ca)
        except (OSError, ssl.SSLError) as exc:
            raise errors.ConfigError("tls.client_ca",
                                     f"cannot load {config.client_ca}: {exc}") from None
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def internal_context(config: TlsConfig) -> ssl.SSLContext | None:
    """The context of the broker's own client connections to its shards (the router's
    monitor), or None without TLS. It does not verify the shard (the router knows its
    address from the proven registration) and, with ``tls.client_ca``, presents the
    server's certificate as its client certificate (so that CA must trust it too)."""
    if config.cert is None:
        return None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    if config.client_ca is not None:
        context.load_cert_chain(config.cert, config.key)
    return context


class _Replayed(trio.abc.Stream):
    """A stream whose first bytes were already read: they come again first."""

    def __init__(self, stream: trio.abc.Stream, head: bytes) -> None:
        self.stream = stream
        self.head = head

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        if self.head:
            data, self.head = self.head, b""
            return data
        return await self.stream.receive_some(max_bytes)

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self.stream.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.stream.wait_send_all_might_not_block()

    async def aclose(self) -> None:
        await self.stream.aclose()


async def accept(stream: trio.abc.Stream, context: ssl.SSLContext
                 ) -> tuple[trio.SSLStream[Any], str | None]:
    """The TLS stream over an accepted ``stream`` once its handshake is done, and the
    client certificate's common name (None without one).

    Raises ProtocolError after answering a plain Flux client with a plain ERROR,
    or ``trio.BrokenResourceError`` when the handshake fails (a wrong or missing
    client certificate, a peer that hung up). The caller bounds the time.
    """
    head = await stream.receive_some(RECV_BYTES)
    if not head:
        raise trio.BrokenResourceError("the client closed before its TLS handshake")
    if head[0] != TLS_RECORD:
        refusal = errors.ProtocolError(
            "this port speaks TLS: connect with a flux+tls:// URL (or tls=...)")
        await stream.send_all(protocol.encode(protocol.error_frame(0, refusal)))
        raise refusal
    tls = trio.SSLStream(_Replayed(stream, bytes(head)), context, server_side=True)
    await tls.do_handshake()
    return tls, common_name(tls.getpeercert())


def common_name(cert: Any) -> str | None:
    """The subject's common name of a certificate as ``getpeercert()`` gives it."""
    if not cert:
        return None
    for rdn in cert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return None


def throwaway_pki(directory: str) -> dict[str, str]:
    """A new CA and a server certificate for 127.0.0.1 and localhost, written to
    ``directory``: paths ``ca``, ``cert``, ``key``. For benchmarks and chaos runs (it
    needs trustme, a dev dependency); never for a real broker."""
    import os

    import trustme

    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    files = {name: os.path.join(directory, file) for name, file in
             (("ca", "ca.pem"), ("cert", "server.pem"), ("key", "server.key"))}
    ca.cert_pem.write_to_path(files["ca"])
    for i, pem in enumerate(server.cert_chain_pems):
        pem.write_to_path(files["cert"], append=i > 0)
    server.private_key_pem.write_to_path(files["key"])
    return files
