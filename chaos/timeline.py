"""A PNG timeline of a chaos run: throughput per second under the faults, per target.

Needs matplotlib (the optional ``chaos`` extra); :func:`draw` returns False and
draws nothing without it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from chaos.schedule import KINDS

COLOURS = {"shard-kill": "#d62728", "shard-pause": "#ff7f0e", "router-kill": "#9467bd",
           "latency": "#bcbd22", "stall": "#17becf", "reset": "#8c564b", "blackhole": "#7f7f7f"}


def draw(data: dict[str, Any], path: Path) -> bool:
    """Draw ``report.json``-shaped ``data`` to ``path``; False if matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch
    except ImportError:
        return False
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(14, 7), sharex=True,
                                      gridspec_kw={"height_ratios": [2, 1]})
    acked = data["throughput"]["acked_per_s"]
    delivered = data["throughput"]["delivered_per_s"]
    top.plot(range(len(acked)), acked, label="publishes acked / s", linewidth=0.9)
    top.plot(range(len(delivered)), delivered, label="deliveries / s", linewidth=0.9, alpha=0.8)
    kinds = data.get("storage", {}).get("by_kind", {})
    if len(kinds) > 1:   # a mixed run: publish acks of memory and of disk topics apart
        for kind, style in (("memory", ":"), ("disk", "--")):
            series = data["throughput"].get(f"acked_per_s_{kind}", [])
            top.plot(range(len(series)), series, label=f"acked / s, {kind} topics",
                     linewidth=0.8, linestyle=style)
    top.set_ylabel("messages / s")
    top.legend(loc="lower left")
    lost = ", ".join(f"{kind} lost {st['lost_unexplained']}" for kind, st in kinds.items())
    top.set_title(f"chaos seed {data['seed']}: {data['faults']['injected']} faults, "
                  f"{data['messages']['published']} messages"
                  f" (storage {data.get('storage', {}).get('mode', 'memory')}"
                  f"{': ' + lost if lost else ''}), "
                  f"{'PASS' if data['ok'] else 'FAIL'}")
    rows = ["router", "shard-0", "shard-1", "shard-2"]
    for fault in data["faults"]["list"]:
        if fault["skipped"] or fault["began"] is None:
            continue
        row = rows.index(fault["target"]) if fault["target"] in rows else 0
        begin = fault["began"]
        width = max(0.15, (fault["ended"] or begin) - begin)
        bottom.broken_barh([(begin, width)], (row - 0.4, 0.8),
                           facecolors=COLOURS.get(fault["kind"], "black"), alpha=0.8)
        top.axvspan(begin, begin + width, color=COLOURS.get(fault["kind"], "black"),
                    alpha=0.06, linewidth=0)
    for name, at in data.get("phases", {}).items():
        if name != "start" and at is not None:
            for ax in (top, bottom):
                ax.axvline(at, color="black", linestyle="--", linewidth=0.8)
            top.annotate(name, (at, 1.0), xycoords=("data", "axes fraction"),
                         textcoords="offset points", xytext=(2, -10), fontsize="small")
    bottom.set_yticks(range(len(rows)), rows)
    bottom.set_xlabel("seconds since start")
    bottom.legend(handles=[Patch(color=COLOURS[k], label=k) for k in KINDS],
                  loc="upper center", ncol=len(KINDS), fontsize="small",
                  bbox_to_anchor=(0.5, -0.35))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
