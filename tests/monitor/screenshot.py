"""Make the README's dashboard picture: ``python -m tests.monitor.screenshot OUT.png``.

Starts ``flux serve`` on free ports (``payments.*`` on disk), runs a minute of traffic
(a steady producer, a consumer that keeps up, one that falls behind, a pull reader),
then photographs the dashboard in headless Chromium. Every process it starts is
stopped at the end.
"""

from __future__ import annotations

import sys
import tempfile
import threading
import time
from pathlib import Path

from flux.client import sync
from tests.conftest import Broker
from tests.monitor.browser import headless_chromium
from tests.monitor.support import HTTP_LINE

SECONDS = 60.0


def traffic(url: str, stop: threading.Event) -> None:
    with sync.connect(url) as client:
        client.subscribe_pull("audit.log", "nightly-export", read_old=True)
        n = 0
        while not stop.is_set():
            client.publish_many("orders.eu", [f'{{"order": {n + i}, "eur": {(n + i) % 97}}}'.encode()
                                              for i in range(20)])
            client.publish("audit.log", f"user {n % 13} logged in".encode())
            if n % 200 == 0:
                client.publish("payments.card", bytes(range(n % 50, n % 50 + 16)))
            n += 20
            time.sleep(0.05)


def consume(url: str, name: str, delay: float, stop: threading.Event) -> None:
    with sync.connect(url) as client, client.subscribe("orders.eu", name=name,
                                                       read_old=True) as sub:
        for msg in sub:
            msg.ack()
            if stop.is_set():
                return
            if delay:
                time.sleep(delay)


def main(out: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        broker = Broker(Path(tmp), 2, ("http.stats_interval=1", f"storage.dir={tmp}/data",
                                       "topics=[{match: 'payments.*', storage: {kind: disk}}]"))
        try:
            line = broker.router.next_line(time.monotonic() + 30)
            match = HTTP_LINE.match(line)
            assert match, line
            stop = threading.Event()
            workers = [threading.Thread(target=traffic, args=(broker.url, stop)),
                       threading.Thread(target=consume, args=(broker.url, "billing", 0.0, stop)),
                       threading.Thread(target=consume, args=(broker.url, "fraud-check", 0.004,
                                                              stop))]
            for worker in workers:
                worker.start()
            time.sleep(SECONDS)
            with headless_chromium() as browser:
                page = browser.new_page(viewport={"width": 1366, "height": 860})
                page.goto(match.group(1) + "#topic=orders.eu&offset=120")
                page.wait_for_selector("#messages tbody tr")
                time.sleep(3)
                page.evaluate("window.scrollTo(0, 0)")
                page.screenshot(path=out)
            stop.set()
            for worker in workers:
                worker.join(timeout=20)
        finally:
            broker.stop()
            broker.assert_all_gone()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "dashboard.png")
