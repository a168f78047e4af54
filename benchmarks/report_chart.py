"""The benchmark's chart (``latest.png``, written by ``report.write``): throughput beside the reference, the peer
and the published figures; idle latency and recovery."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from report_format import PUBLISHED, PUBLISHED_NOTE
from report_targets import _peer_rate


def chart(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(14, 6.5), gridspec_kw={"width_ratios": [3, 2]})
    labels, values, lo, hi, colors = [], [], [], [], []
    for clients, r in (results.get("reference") or {}).items():
        labels.append(f"reference: plain SQL, {clients} client{'s' if clients != '1' else ''}")
        values.append(r["median"])
        lo.append(r["median"] - r["min"])
        hi.append(r["max"] - r["median"])
        colors.append("#9e9e9e")
    peer = results.get("peer") or {}
    if _peer_rate(results):
        s = peer["tasks_per_s"]
        labels.append(
            f"procrastinate {peer['version']}: {peer['jobs']} jobs, {peer['workers']} workers"
            f" x concurrency {peer['worker_concurrency']}"
        )
        values.append(s["median"])
        lo.append(s["median"] - s["min"])
        hi.append(s["max"] - s["median"])
        colors.append("#2ca02c")
    for r in results.get("throughput", []):
        s = r["tasks_per_s"]
        labels.append("AWP: " + r["label"])
        values.append(s["median"])
        lo.append(s["median"] - s["min"])
        hi.append(s["max"] - s["median"])
        colors.append("#1f77b4")
    for source, figs in PUBLISHED:
        for k, v in figs.items():
            labels.append(f"{source.split(',')[0].split(' (')[0]}, {k} ({PUBLISHED_NOTE})")
            values.append(v)
            lo.append(0)
            hi.append(0)
            colors.append("#f4c58a")
    y = list(range(len(labels)))[::-1]
    ax.barh(y, values, xerr=[lo, hi], color=colors, capsize=3)
    ax.set_yticks(y, labels, fontsize=8)
    ax.set_xscale("log")
    ax.set_xlabel("tasks/s (log scale; bars = median, whiskers = min-max)")
    ax.set_title("Throughput")
    for yi, v, h in zip(y, values, hi, strict=True):
        ax.text((v + h) * 1.06, yi, f"{v:,.0f}", va="center", fontsize=7)
    ax.axvline(500, color="#d62728", lw=0.8, ls="--")
    ax.text(500, y[0] + 0.6, " target 500", color="#d62728", fontsize=7)
    from matplotlib.patches import Patch

    legend = [
        ("#9e9e9e", "plain-SQL reference (measured)"),
        ("#2ca02c", "procrastinate (measured)"),
        ("#1f77b4", "AWP (measured)"),
        ("#f4c58a", PUBLISHED_NOTE),
    ]
    ax.legend(
        handles=[Patch(color=c, label=lbl) for c, lbl in legend],
        fontsize=7,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.1),
        ncol=2,
    )

    names, meds, p95s = [], [], []
    lat = results.get("latency")
    if lat:
        names += ["idle: submit -> claim", "idle: submit -> finish"]
        meds += [lat["claim_ms"]["p50"], lat["finish_ms"]["p50"]]
        p95s += [lat["claim_ms"]["p95"], lat["finish_ms"]["p95"]]
    for r in results.get("recovery") or []:
        names.append(f"kill -9 -> takeover ({r['lease_ms'] / 1000:g} s lease)")
        meds.append(r["takeover_ms"]["median"])
        p95s.append(r["takeover_ms"]["max"])
    if names:
        x = range(len(names))
        ax2.bar(x, meds, color="#1f77b4", label="median")
        ax2.scatter(x, p95s, color="#d62728", zorder=3, label="p95 (latency) / max (takeover)")
        ax2.set_xticks(list(x), names, rotation=25, ha="right", fontsize=8)
        ax2.set_yscale("log")
        ax2.set_ylabel("ms (log scale)")
        ax2.axhline(20, color="#d62728", lw=0.8, ls="--", label="target: claim p50 20 ms")
        ax2.legend(fontsize=7)
        for xi, v in zip(x, meds, strict=True):
            ax2.text(xi, v * 1.1, f"{v:,.0f}" if v >= 100 else f"{v:.1f}", ha="center", fontsize=7)
    ax2.set_title("Latency and recovery")
    fig.suptitle(
        f"AWP benchmark ({results['plan']['name']}, {results['started_at']}), "
        f"{results['machine'].get('cpus')} CPUs, PostgreSQL {results['postgres']['server_version']} fsync on",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
