"""TLS on the router and every shard port through a real ``flux serve``: every client
flavour and the CLI over TLS, and each way a handshake must fail (certificates made
by trustme)."""

from __future__ import annotations

import asyncio
import datetime
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import trio

from flux import errors
from flux.auth.credentials import token_digest
from flux.client import asyncio as aio
from flux.client import sync
from flux.client.tls import client_context
from flux.client.trio import connect
from tests.monitor.support import HTTP_LINE, wait_for

if TYPE_CHECKING:
    from tests.conftest import Broker, BrokerFactory

trustme = pytest.importorskip("trustme")
pytestmark = pytest.mark.integration
TIMEOUT = 40


class Pki:
    """A test CA, the server's certificate (127.0.0.1 and localhost) and files."""

    def __init__(self, tmp: Path, *, expired: bool = False) -> None:
        self.tmp = tmp
        tmp.mkdir(exist_ok=True)
        self.ca = trustme.CA()
        kwargs = {}
        if expired:
            now = datetime.datetime.now(datetime.UTC)
            kwargs = {"not_before": now - datetime.timedelta(days=10),
                      "not_after": now - datetime.timedelta(days=1)}
        server = self.ca.issue_cert("127.0.0.1", "localhost", **kwargs)
        self.ca_file = self.write("ca.pem", self.ca.cert_pem.bytes())
        self.cert = self.write("server.pem", b"".join(b.bytes() for b in server.cert_chain_pems))
        self.key = self.write("server.key", server.private_key_pem.bytes())

    def write(self, name: str, data: bytes) -> str:
        path = self.tmp / name
        path.write_bytes(data)
        return str(path)

    def client(self, name: str) -> tuple[str, str]:
        """A client certificate whose common name is ``name``: (cert file, key file)."""
        leaf = self.ca.issue_cert(f"{name}@clients.test", common_name=name)
        return (self.write(f"{name}.pem", b"".join(b.bytes() for b in leaf.cert_chain_pems)),
                self.write(f"{name}.key", leaf.private_key_pem.bytes()))

    def config(self, extra: str = "") -> str:
        return f"tls:\n  cert: {self.cert}\n  key: {self.key}\n{extra}"


def tls_url(broker: Broker) -> str:
    return f"flux+tls://{broker.address}"


def start(factory: BrokerFactory, config: str) -> tuple[Broker, str]:
    """A broker with its HTTP endpoint (gathering STATS every 0.2 s, a HELLO deadline of
    2 s) and its URL."""
    broker = factory("http.stats_interval=0.2", "limits.hello_timeout=2", config=config)
    match = HTTP_LINE.match(broker.router.next_line(time.monotonic() + 30))
    assert match
    return broker, match.group(1)


def gathered(http: str, token: str | None = None) -> None:
    """The monitor reaches every shard over TLS (its STATS arrive)."""
    request = urllib.request.Request(http + "api/shards", headers={
        "Authorization": f"Bearer {token}"} if token else {})

    def probe() -> bool:
        with urllib.request.urlopen(request, timeout=5) as response:
            shards = json.loads(response.read())["shards"]
        return all(s["uptime"] is not None and s["error"] is None for s in shards)

    wait_for(probe, "the monitor's STATS of every shard over TLS")


async def test_every_client_flavour_and_the_cli_speak_tls(
        broker_factory: BrokerFactory, tmp_path: Path) -> None:
    pki = Pki(tmp_path / "pki")
    broker, http = start(broker_factory, pki.config())
    url = tls_url(broker)
    await trio.to_thread.run_sync(gathered, http)
    with trio.fail_after(TIMEOUT):
        async with connect(url, tls=pki.ca_file) as client:
            for i in range(20):  # topics on both shards
                await client.publish(f"t.{i}", b"x", id="a")
            async with client.subscribe("t.0", read_old=True) as sub:
                msg = await sub.__anext__()
                assert msg.payload == b"x"
                await msg.ack()
        async with connect(f"{url}?ca={pki.ca_file}") as client:  # the CA in the URL
            assert (await client.fetch("t.1", 0)).messages[0].payload == b"x"

    async def via_asyncio() -> int:
        async with aio.connect(url, tls=pki.ca_file) as client:
            return (await client.publish("t.0", b"aio", id="aio")).offset

    assert await trio.to_thread.run_sync(asyncio.run, via_asyncio()) == 1
    with sync.connect(url, tls=client_context(url, pki.ca_file)) as client:
        assert client.publish("t.0", b"sync", id="sync").offset == 2
    done = subprocess.run([sys.executable, "-m", "flux", "pub", "t.0", "cli", "--url", url],
                          capture_output=True, text=True, timeout=TIMEOUT,
                          env={**os.environ, "FLUX_TLS_CA": pki.ca_file})
    assert done.returncode == 0 and "offset=3" in done.stdout, done.stderr

    with trio.fail_after(TIMEOUT):
        # a client that trusts another CA refuses the broker
        other = Pki(tmp_path / "other")
        with pytest.raises(errors.ConnectionLost, match="CERTIFICATE_VERIFY_FAILED"):
            async with connect(url, tls=other.ca_file, request_timeout=3, retry_deadline=3):
                pass
        # a plain client on a TLS port is told so, in plain Flux, before the close
        with pytest.raises(errors.ConnectionLost, match="speaks TLS"):
            async with connect(f"flux://{broker.address}", request_timeout=3,
                               retry_deadline=3):
                pass
        # a connection that never starts its handshake is closed at the HELLO deadline
        for address in [broker.address, *(s.address for s in broker.shards.values())]:
            host, port = address.rsplit(":", 1)
            silent = await trio.open_tcp_stream(host, int(port))
            with trio.fail_after(10):
                assert await silent.receive_some(100) == b""
            await silent.aclose()


async def test_an_expired_server_certificate_is_refused(
        broker_factory: BrokerFactory, tmp_path: Path) -> None:
    pki = Pki(tmp_path / "pki", expired=True)
    broker = broker_factory("http.enabled=false", config=pki.config())
    with trio.fail_after(TIMEOUT), pytest.raises(errors.ConnectionLost, match="expired"):
        async with connect(tls_url(broker), tls=pki.ca_file, request_timeout=3,
                           retry_deadline=3):
            pass


async def test_mutual_tls_requires_a_client_certificate_that_can_name_a_user(
        broker_factory: BrokerFactory, tmp_path: Path) -> None:
    pki = Pki(tmp_path / "pki")
    alice_cert, alice_key = pki.client("alice")
    mallory_cert, mallory_key = pki.client("mallory")
    users = f"""\
auth:
  users:
    - name: admin
      token_sha256: {token_digest("admin-token")}
      admin: [">"]
    - name: alice
      certificate: alice
      publish: [alice.>]
      subscribe: [alice.>]
"""
    broker, http = start(broker_factory, pki.config(f"  client_ca: {pki.ca_file}\n{users}"))
    url = tls_url(broker)
    # the router's monitor presents the server certificate (the same CA signed it)
    await trio.to_thread.run_sync(gathered, http, "admin-token")
    with trio.fail_after(TIMEOUT):
        with pytest.raises(errors.ConnectionLost):  # no client certificate
            async with connect(url, tls=pki.ca_file, request_timeout=3, retry_deadline=3):
                pass
        alice = client_context(url, ca=pki.ca_file, cert=alice_cert, key=alice_key)
        async with connect(url, tls=alice) as client:  # the certificate is the credential
            assert (await client.publish("alice.box", b"hi", id="1")).offset == 0
            with pytest.raises(errors.NotAuthorized):
                await client.publish("bob.box", b"hi", id="2")
        mallory = client_context(url, ca=pki.ca_file, cert=mallory_cert, key=mallory_key)
        with pytest.raises(errors.AuthenticationFailed):  # a good certificate, no user
            async with connect(url, tls=mallory):
                pass


async def _handshake(address: str, ca: str) -> bool:
    """Whether a TLS handshake with ``address`` succeeds for a client trusting ``ca``."""
    host, port = address.rsplit(":", 1)
    stream = await trio.open_tcp_stream(host, int(port))
    tls = trio.SSLStream(stream, client_context(f"flux+tls://{address}", ca),
                         server_hostname=host)
    try:
        with trio.fail_after(10):
            await tls.do_handshake()
        return True
    except trio.BrokenResourceError:
        return False
    finally:
        await tls.aclose()


async def test_sighup_reloads_the_certificates_and_keeps_open_connections(
        broker_factory: BrokerFactory, tmp_path: Path) -> None:
    old = Pki(tmp_path / "old")
    broker = broker_factory("http.enabled=false", config=old.config())
    url = tls_url(broker)
    addresses = [broker.address, *(s.address for s in broker.shards.values())]
    new = Pki(tmp_path / "new")  # a renewed certificate, from another CA, at the same paths
    with trio.fail_after(TIMEOUT):
        async with connect(url, tls=old.ca_file) as kept:
            await kept.publish("t.0", b"before", id="before")
            Path(old.cert).write_bytes(Path(new.cert).read_bytes())
            Path(old.key).write_bytes(Path(new.key).read_bytes())
            assert broker.config is not None
            broker.router.proc.send_signal(signal.SIGHUP)
            for address in addresses:  # the router and every shard shake hands anew
                while not await _handshake(address, new.ca_file):
                    await trio.sleep(0.05)
                assert not await _handshake(address, old.ca_file)
            async with connect(url, tls=new.ca_file) as client:
                for i in range(10):  # topics on both shards
                    await client.publish(f"t.{i}", b"after", id="after")
            # the connection opened before the reload goes on with its certificate
            assert (await kept.publish("t.0", b"kept", id="kept")).offset == 2

            # certificates that do not load are refused and the running ones kept
            broker.config.write_text(
                old.config().replace(old.cert, str(tmp_path / "missing.pem")))
            broker.router.proc.send_signal(signal.SIGHUP)
            await trio.sleep(1.0)
            for address in addresses:
                assert await _handshake(address, new.ca_file)
            # and so is turning TLS off
            broker.config.write_text("")
            broker.router.proc.send_signal(signal.SIGHUP)
            await trio.sleep(1.0)
            for address in addresses:
                assert await _handshake(address, new.ca_file)
