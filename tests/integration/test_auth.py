"""Auth (G13) through a real ``flux serve --config FILE``: tokens and passwords in all
three client flavours and the CLI, per-item refusals, STATS, the HTTP endpoint, SIGHUP."""

from __future__ import annotations

import base64
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import TYPE_CHECKING

import pytest
import trio

from flux import errors
from flux.auth.credentials import hash_password, token_digest
from flux.client import asyncio as aio
from flux.client import sync
from flux.client.trio import connect
from tests.monitor.support import HTTP_LINE

if TYPE_CHECKING:
    from tests.conftest import Broker, BrokerFactory

pytestmark = pytest.mark.integration
TIMEOUT = 40
ROOT, BOB = "root-token-0123456789", "bob-token-0123456789"
CAROL = hash_password("carol-pw", n=1024)  # one hash: a reload keeps carol's credential


def config(*, carol_publish: str = "orders.>", with_bob: bool = True) -> str:
    users = f"""\
auth:
  users:
    - name: root
      token_sha256: {token_digest(ROOT)}
      publish: [">"]
      subscribe: [">"]
      admin: [">"]
    - name: carol
      password: "{CAROL}"
      publish:
        allow: ["{carol_publish}"]
        deny: [orders.secret]
      subscribe: [orders.*]
"""
    if with_bob:
        users += f"""\
    - name: bob
      token_sha256: {token_digest(BOB)}
      subscribe: [metrics.>]
"""
    return users


def start(factory: BrokerFactory) -> tuple[Broker, str]:
    broker = factory("http.stats_interval=0.2", config=config())
    line = broker.router.next_line(time.monotonic() + 30)
    match = HTTP_LINE.match(line)
    assert match, line
    return broker, match.group(1)


def http_status(url: str, header: str | None = None) -> int:
    request = urllib.request.Request(url, headers={"Authorization": header} if header else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def cli(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "flux", *args], capture_output=True,
                          text=True, timeout=TIMEOUT, env={**os.environ, **env})


async def test_users_do_what_their_rules_allow_and_nothing_else(
        broker_factory: BrokerFactory) -> None:
    broker, http = start(broker_factory)
    host_port = broker.address
    with trio.fail_after(TIMEOUT):
        for credentials in ({}, {"token": "nope"}, {"user": "carol", "password": "wrong"},
                            {"user": "nobody", "password": "carol-pw"}):
            with pytest.raises(errors.AuthenticationFailed):
                async with connect(broker.url, **credentials):
                    pass
        async with connect(f"flux://carol:carol-pw@{host_port}") as carol:
            ack = await carol.publish("orders.eu", b"1", id="a")
            assert ack.offset == 0
            for topic in ("orders.secret", "metrics.cpu"):
                with pytest.raises(errors.NotAuthorized):
                    await carol.publish(topic, b"x", id="b")
            await carol.publish("orders.us", b"2", id="c")  # the connection stayed open
        async with connect(f"flux://{host_port}?token={BOB}") as bob:
            with pytest.raises(errors.NotAuthorized):
                async with bob.subscribe("orders.eu", read_old=True):
                    pass
            with pytest.raises(errors.NotAuthorized):
                await bob.fetch("orders.eu", 0)
            with pytest.raises(errors.NotAuthorized):
                await bob.publish("metrics.cpu", b"x")
            seen = {t for reply in (await bob.stats()).values() for t in reply["topics"]}
            assert seen == set()
        async with connect(broker.url, token=ROOT) as root:
            await root.publish("metrics.cpu", b"9", id="m")
            seen = {t for reply in (await root.stats()).values() for t in reply["topics"]}
            assert seen == {"orders.eu", "orders.us", "metrics.cpu"}
        async with connect(broker.url, token=BOB) as bob:
            seen = {t for reply in (await bob.stats()).values() for t in reply["topics"]}
            assert seen == {"metrics.cpu"}
            result = await bob.fetch("metrics.cpu", 0)
            assert [m.payload for m in result.messages] == [b"9"]

    # the asyncio and blocking flavours take the same credentials
    async def via_asyncio() -> int:
        async with aio.connect(broker.url, user="carol", password="carol-pw") as client:
            return (await client.publish("orders.eu", b"aio", id="aio")).offset

    import asyncio
    assert await trio.to_thread.run_sync(asyncio.run, via_asyncio()) == 1
    with sync.connect(broker.url, token=ROOT) as client:
        assert client.publish("orders.eu", b"sync", id="sync").offset == 2
    with pytest.raises(errors.AuthenticationFailed):
        sync.connect(broker.url, token="wrong")

    # the CLI: flags or environment variables
    done = cli("pub", "orders.eu", "cli", "--url", broker.url, FLUX_USER="carol",
               FLUX_PASSWORD="carol-pw")
    assert done.returncode == 0 and "offset=3" in done.stdout, done.stderr
    done = cli("pub", "orders.eu", "cli", "--url", broker.url, "--token", BOB)
    assert done.returncode != 0 and "NotAuthorized" in done.stderr
    done = cli("stats", "--url", broker.url, "--json")
    assert done.returncode != 0 and "AuthenticationFailed" in done.stderr

    # the HTTP endpoint: an admin of every topic, by bearer token or basic password
    api = http + "api/overview"
    assert http_status(api) == 401
    assert http_status(api, f"Bearer {BOB}") == 403
    assert http_status(api, f"Bearer {ROOT}") == 200
    basic = base64.b64encode(b"carol:carol-pw").decode()
    assert http_status(api, f"Basic {basic}") == 403
    assert http_status(http + "healthz") == 200


async def test_sighup_reloads_auth_keeping_allowed_connections(
        broker_factory: BrokerFactory) -> None:
    broker = broker_factory("http.enabled=false", config=config())
    with trio.fail_after(TIMEOUT):
        async with connect(broker.url, user="carol", password="carol-pw") as carol, \
                connect(broker.url, token=BOB) as bob, \
                connect(broker.url, token=ROOT) as root:
            await carol.publish("orders.us", b"before", id="before")
            await root.publish("metrics.cpu", b"m", id="m")
            async with bob.subscribe("metrics.cpu", read_old=True) as sub:
                first = await sub.__anext__()
                await first.ack()
                assert broker.config is not None
                broker.config.write_text(config(carol_publish="orders.eu", with_bob=False))
                broker.router.proc.send_signal(signal.SIGHUP)
                while True:  # the reload reaches the shards: carol's next publish is refused
                    try:
                        await carol.publish("orders.us", b"after", id=f"t{time.monotonic()}")
                    except errors.NotAuthorized:
                        break
                    await trio.sleep(0.05)
                await carol.publish("orders.eu", b"still", id="still")  # still allowed
                with pytest.raises(errors.AuthenticationFailed):  # bob is gone: closed
                    await sub.__anext__()
            await root.publish("metrics.cpu", b"n", id="n")  # unaffected
