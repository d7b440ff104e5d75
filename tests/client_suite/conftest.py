"""Fixtures of the shared client suite: the flavour matrix and real brokers on loopback.

Every ``@pytest.mark.anyio`` test here runs once per flavour (trio, asyncio,
asyncio on uvloop, and the blocking client), under anyio's pytest plugin. The
project runs pytest-trio with ``trio_mode = true``, which claims every async
test for trio: the hook below hands anyio-marked tests back to anyio.
Brokers are ``flux serve`` processes shared by this package's tests (each test uses
its own topics); they are stopped and checked like the ``broker`` fixture's.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .flavours import FLAVOURS, HAVE_UVLOOP, Flavour


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # runs after pytest-trio's trio_mode marked every coroutine test as a trio test
    for item in items:
        if item.get_closest_marker("anyio") is not None:
            item.own_markers[:] = [m for m in item.own_markers if m.name != "trio"]


def _params() -> list[Any]:
    skip_uvloop = pytest.mark.skipif(not HAVE_UVLOOP, reason="uvloop is not installed")
    return [pytest.param(FLAVOURS[name], id=name, marks=[skip_uvloop] if name == "uvloop" else [])
            for name in FLAVOURS]


@pytest.fixture(scope="module", params=_params())
def flavour(request: pytest.FixtureRequest) -> Flavour:
    """The client flavour under test."""
    flavour: Flavour = request.param
    return flavour


@pytest.fixture(scope="module")
def anyio_backend(flavour: Flavour) -> Any:
    """anyio's plugin runs each test on the event loop its flavour needs."""
    return flavour.backend


def _factory(tmp_path_factory: pytest.TempPathFactory, name: str) -> Any:
    from conftest import BrokerFactory  # tests/conftest.py (rootdir-relative import)

    return BrokerFactory(tmp_path_factory.mktemp(name))


@pytest.fixture(scope="package")
def suite_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A ``flux serve --shards 2`` shared by the suite (heartbeat 1 s, ack timeout 2 s)."""
    factory = _factory(tmp_path_factory, "suite")
    try:
        yield factory()
    finally:
        factory.close()


@pytest.fixture(scope="package")
def dead_letter_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A broker with the dead-letter policy on every topic, two pushes per message."""
    factory = _factory(tmp_path_factory, "deadletter")
    try:
        yield factory("dead_letter.enabled=true", "subscriber.retry_count=1",
                      "subscriber.timeout=1", "subscriber.retry_interval=0.2")
    finally:
        factory.close()


@pytest.fixture(scope="package")
def tight_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A broker whose topics hold at most 2000 bytes (TopicFull comes quickly)."""
    factory = _factory(tmp_path_factory, "tight")
    try:
        yield factory("topic.max_bytes=2000")
    finally:
        factory.close()


@pytest.fixture(scope="package")
def crash_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A broker whose shard processes tests may SIGKILL (the router restarts them)."""
    factory = _factory(tmp_path_factory, "crash")
    try:
        yield factory()
    finally:
        factory.close()


@pytest.fixture(scope="package")
def disk_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Path]]:
    """One shard, every topic on disk, no payload cache (every delivery reads its record
    back from the log): the broker and its data directory."""
    factory = _factory(tmp_path_factory, "disk")
    data = tmp_path_factory.mktemp("disk-data")
    try:
        yield factory("storage.cache_bytes=0", "message.ttl=600", shards=1,
                      args=("--data-dir", str(data))), data
    finally:
        factory.close()


@pytest.fixture
def topic(request: pytest.FixtureRequest, flavour: Flavour) -> str:
    """A topic name of this test and flavour, so tests sharing a broker never meet."""
    name = re.sub(r"[^A-Za-z0-9_-]", "-", request.node.originalname)
    return f"{flavour.name}.{name}"
