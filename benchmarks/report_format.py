"""The building blocks of the benchmark's report (``report.py``): the peers' published figures, the number
formats of its cells and ``Table`` (plain text and Markdown)."""

from __future__ import annotations

import statistics
from typing import Any

# Peers' figures as published: NOT measured by this harness, shown for context only.
PUBLISHED = [
    ("seed article (design article of this project)", {"1 worker": 18.3, "4 workers": 27.6, "16 workers": 30.0}),
    ("procrastinate 3.10, 2-core machine", {"1 worker": 167.0, "4 workers": 259.0}),
]
PUBLISHED_NOTE = "published, not measured in this run"
REF_LIMIT = "8"  # the 8-client reference is "the machine's limit"
REF_PEER = "4"  # the reference with as many clients as the side-by-side shape has worker processes


# ---- helpers ----------------------------------------------------------------------------------------------


def _f(x: Any, digits: int = 0) -> str:
    if x is None:
        return "-"
    return f"{x:,.{digits}f}"


def _spread(s: dict[str, Any], digits: int = 0) -> str:
    if s.get("median") is None:
        return "-"
    if s.get("n", 0) <= 1:
        return _f(s["median"], digits)
    return f"{_f(s['min'], digits)}-{_f(s['max'], digits)}"


def _ms(s: dict[str, Any] | None, digits: int = 2) -> str:
    """A median with its min-max: ``1.23 (1.10-1.40)``."""
    if not s or s.get("median") is None:
        return "-"
    if s.get("n", 0) <= 1:
        return _f(s["median"], digits)
    return f"{_f(s['median'], digits)} ({_f(s['min'], digits)}-{_f(s['max'], digits)})"


def _busy(reps: list[dict[str, Any]], cpus: int | None) -> str:
    """How busy the machine's cores were during the repetitions: the CPU seconds of every measured process over
    span x cores, per repetition, as ``68% (62-74%)`` (median (min-max)); ``-`` when unknown (a process kind's CPU
    not measured, e.g. PostgreSQL's on a server the bench did not start)."""
    shares = sorted(
        sum(r["cpu_s"].values()) / (r["span_s"] * cpus)
        for r in reps
        if cpus and r.get("span_s") and r.get("cpu_s") and None not in r["cpu_s"].values()
    )
    if not shares:
        return "-"
    median = statistics.median(shares)
    if len(shares) == 1:
        return f"{median:.0%}"
    return f"{median:.0%} ({shares[0]:.0%}-{shares[-1]:.0%})"


def _pcts(p: dict[str, Any], keys: tuple[str, ...] = ("p50", "p95", "p99")) -> str:
    if not p or not p.get("n"):
        return "-"
    return " / ".join(_f(p[k], 1) for k in keys)


class Table:
    def __init__(self, title: str, headers: list[str], right: set[int] | None = None) -> None:
        self.title = title
        self.headers = headers
        self.rows: list[list[str]] = []
        self.right = right if right is not None else set(range(1, len(headers)))
        self.notes: list[str] = []

    def add(self, *cells: Any) -> None:
        self.rows.append([str(c) for c in cells])

    def text(self) -> str:
        widths = [max(len(r[i]) for r in [self.headers, *self.rows]) for i in range(len(self.headers))]

        def line(cells: list[str]) -> str:
            return "  ".join(
                c.rjust(w) if i in self.right else c.ljust(w)
                for i, (c, w) in enumerate(zip(cells, widths, strict=True))
            )

        out = [self.title, line(self.headers), "  ".join("-" * w for w in widths)]
        out += [line(r) for r in self.rows]
        out += [f"  {n}" for n in self.notes]
        return "\n".join(x.rstrip() for x in out)

    def markdown(self) -> str:
        out = [f"**{self.title}**", "", "| " + " | ".join(self.headers) + " |"]
        out.append("|" + "|".join("---:" if i in self.right else ":---" for i in range(len(self.headers))) + "|")
        out += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in self.rows]
        if self.notes:
            out += [""] + [f"{n}  " for n in self.notes]
        return "\n".join(out)
