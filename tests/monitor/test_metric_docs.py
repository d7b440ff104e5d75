"""The metrics docs: the Grafana dashboard and the README list what ``/metrics`` serves."""

from __future__ import annotations

import json
import re

from prometheus_client.parser import text_string_to_metric_families

from flux.bench.monitor_scrape import synthetic
from flux.monitor.metrics import MetricsPage
from tests.conftest import ROOT

DASHBOARD = ROOT / "monitoring" / "grafana-flux.json"


def test_every_metric_the_dashboard_queries_is_served() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    queried = {name for expr in exprs for name in re.findall(r"\bflux_[a-z_]+\b", expr)}
    page = MetricsPage(lambda: synthetic(100)).render().decode()
    served = {s.name for family in text_string_to_metric_families(page) for s in family.samples}
    assert queried and queried <= served, queried - served
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])
    assert dashboard["__inputs"][0]["pluginId"] == "prometheus"


def test_readme_lists_every_metric_served_with_its_type() -> None:
    readme = (ROOT / "README.md").read_text().split("### Metrics", 1)[1].split("\n### ", 1)[0]
    documented = dict(re.findall(r"^\| `(flux_[a-z_]+)` \| (gauge|counter|histogram) \|",
                                 readme, re.M))
    page = MetricsPage(lambda: synthetic(100)).render().decode()
    served = {family.name + ("_total" if family.type == "counter" else ""): family.type
              for family in text_string_to_metric_families(page)}
    assert documented == served
