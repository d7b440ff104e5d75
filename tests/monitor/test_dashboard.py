"""The dashboard in a real headless Chromium against a real ``flux serve``.

The page must show the topics and subscriptions the test made, the lag it expects,
and the message browser must show the payloads it published.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.conftest import BrokerFactory
from tests.monitor.browser import headless_chromium
from tests.monitor.support import (
    AUDIT,
    BILLING_ACKED,
    ORDERS,
    ORDERS_COUNT,
    Monitored,
    run_workload,
    start,
)

pytestmark = [pytest.mark.integration, pytest.mark.browser]
TIMEOUT_MS = 20_000


@pytest.fixture
def browser() -> Iterator[Browser]:
    with headless_chromium() as chromium:
        yield chromium


@pytest.fixture
def dashboard(broker_factory: BrokerFactory, browser: Browser) -> Iterator[tuple[Monitored, Page]]:
    monitored = start(broker_factory)
    run_workload(monitored.broker.url)
    page = browser.new_page(viewport={"width": 1366, "height": 900})
    page.set_default_timeout(TIMEOUT_MS)
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(monitored.url)
    yield monitored, page
    page.close()
    assert errors == [], f"the page raised: {errors}"


def test_dashboard_shows_topics_subscriptions_and_the_expected_lag(
        dashboard: tuple[Monitored, Page], tmp_path: Path) -> None:
    _, page = dashboard
    expect(page).to_have_title("Flux dashboard")
    expect(page.locator("#health")).to_have_text("healthy")
    expect(page.locator("#card-shards")).to_have_text("2 / 2")
    billing = page.locator(f'#subscriptions tr[data-topic="{ORDERS}"][data-name="billing"]')
    expect(billing.locator("td.lag")).to_have_text(str(ORDERS_COUNT - BILLING_ACKED))
    expect(billing.locator("td.cursor")).to_have_text(str(BILLING_ACKED))
    expect(billing.locator("td.state")).to_have_text("inactive")
    expect(billing).to_have_class("behind inactive")
    replay = page.locator(f'#subscriptions tr[data-topic="{AUDIT}"][data-name="replay"]')
    expect(replay.locator("td.lag")).to_have_text("3")
    # the most-behind card names the subscription a newcomer is looking for
    expect(page.locator("#card-behind")).to_have_text(
        f"billing on {ORDERS}: {ORDERS_COUNT - BILLING_ACKED} behind")
    expect(page.locator(f'#topics tr[data-topic="{ORDERS}"] td.held')).to_have_text(
        str(ORDERS_COUNT))
    expect(page.locator(f'#topics tr[data-topic="{AUDIT}"] td.held')).to_have_text("3")
    expect(page.locator(f'#topics tr[data-topic="{AUDIT}"] td.storage')).to_have_text("memory")
    expect(page.locator("#shards tbody tr")).to_have_count(2)
    page.screenshot(path=str(tmp_path / "dashboard.png"), full_page=True)
    shot = os.environ.get("FLUX_DASHBOARD_SCREENSHOT")  # README's picture: make it on purpose
    if shot:
        page.screenshot(path=shot)


def test_message_browser_shows_the_published_payloads(dashboard: tuple[Monitored, Page]) -> None:
    _, page = dashboard
    page.locator(f'#topics tr[data-topic="{ORDERS}"] a.topic-link').click()
    expect(page.locator("#browser")).to_be_visible()
    expect(page.locator("#browser-topic")).to_have_text(ORDERS)
    rows = page.locator("#messages tbody tr")
    expect(rows).to_have_count(ORDERS_COUNT)
    expect(rows.locator("td.payload")).to_have_text(
        [f"utf-8order {i}" for i in range(ORDERS_COUNT)])
    page.fill("#browser-offset", "7")
    page.click("#browser-form button[type=submit]")
    expect(rows).to_have_count(ORDERS_COUNT - 7)
    expect(rows.first).to_have_attribute("data-offset", "7")
    page.locator(f'#topics tr[data-topic="{AUDIT}"] a.topic-link').click()
    expect(page.locator("#browser-topic")).to_have_text(AUDIT)
    expect(rows).to_have_count(3)
    expect(rows.nth(0).locator("td.payload")).to_have_text("hex0001feff")
    expect(rows.nth(1).locator("td.payload")).to_have_text("utf-8caf\u00e9 \u2603")


def test_dashboard_refreshes_by_itself(dashboard: tuple[Monitored, Page]) -> None:
    monitored, page = dashboard
    topic = page.locator('#topics tr[data-topic="late.topic"]')
    expect(page.locator(f'#topics tr[data-topic="{ORDERS}"]')).to_have_count(1)
    expect(topic).to_have_count(0)
    from flux.client import sync

    with sync.connect(monitored.broker.url) as client:
        client.publish("late.topic", b"hello")
    expect(topic.locator("td.held")).to_have_text("1")
