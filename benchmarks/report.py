"""The benchmark's outputs: a plain-text table (printed), the same in Markdown (``latest.md``, for the
README), the JSON (``bench-<timestamp>.json`` and ``latest.json``) and a chart (``latest.png``)."""

from __future__ import annotations

import datetime as dt
import json
import shutil
import statistics
from pathlib import Path
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


# ---- targets ----------------------------------------------------------------------------------------------


def _by_label_prefix(results: dict[str, Any], prefix: str, workers: int) -> dict[str, Any] | None:
    for t in results.get("throughput", []):
        if t["label"].startswith(prefix) and t.get("workers") == workers and "worker_concurrency" not in t:
            return t
    return None


def _peer_rate(results: dict[str, Any]) -> float | None:
    peer = results.get("peer") or {}
    return (peer.get("tasks_per_s") or {}).get("median") if peer.get("status") == "measured" else None


def _peer_missing(results: dict[str, Any]) -> str:
    peer = results.get("peer")
    if not peer:
        return "procrastinate NOT MEASURED: this run has no peer scenario"
    return f"procrastinate NOT MEASURED ({peer.get('status')}): {peer.get('error', '')}"


def _batch(results: dict[str, Any]) -> dict[str, Any] | None:
    return next((t for t in results.get("throughput", []) if "worker_concurrency" in t), None)


def _scenarios(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Every AWP scenario that ends with awp.check_invariants(): throughput, idle latency, recovery."""
    lat = results.get("latency")
    rec = [r | {"label": f"recovery, {r['label']} lease"} for r in results.get("recovery") or []]
    io = results.get("io_bound")
    return [
        *results.get("throughput", []),
        *([lat | {"label": "idle latency"}] if lat else []),
        *([io] if io else []),
        *rec,
        *(s for s in (results.get("many_runs") or {}).values() if s.get("invariants") is not None),
        *(v for k, v in (results.get("dynamic") or {}).items() if k in ("static", "for_each")),
        *(results.get("pacing") or {}).values(),
    ]


def targets(results: dict[str, Any]) -> list[tuple[str, str, bool | None]]:
    """(target, measured, met) for each target of issue 11 (measured, never asserted); met is None when the
    figure was not measured (shown as NOT MEASURED, never as a pass)."""
    plan = results["plan"]
    single = f"1 run x {plan['single_tasks']} tasks"
    multi = f"{plan['multi_runs']} runs x {plan['multi_tasks']} tasks"
    s4 = _by_label_prefix(results, single, 4)
    s16 = _by_label_prefix(results, single, 16)
    m16 = _by_label_prefix(results, multi, 16)
    batch = _batch(results)
    missing: tuple[str, None] = ("not measured", None)
    out: list[tuple[str, str, bool | None]] = []

    v4 = s4["tasks_per_s"]["median"] if s4 else None
    out.append(
        (f"(1) {single}, 4 workers >= 500 tasks/s", *((f"{v4:,.0f} tasks/s", v4 >= 500) if v4 is not None else missing))
    )
    peer = _peer_rate(results)
    name = f"(1) {single}, 4 workers >= 1.0 x procrastinate (same run, same shape)"
    if v4 is not None and peer:
        out.append((name, f"{v4 / peer:.2f} x ({v4:,.0f} vs {peer:,.0f} tasks/s)", v4 / peer >= 1.0))
    else:
        out.append((name, _peer_missing(results) if v4 is not None else "AWP not measured", None))

    name = f"(2) {single}: 16 workers not slower than 4 (median within 5%)"
    against = (s16 or {}).get("alternated_with")
    if against and against.get("workers") == 4:  # 4 workers' repetitions alternating with 16's
        four, how = against, "; repetitions alternating"
    else:  # results written before the alternation: the 4-worker scenario's figure
        four, how = s4, ""
    if four and s16:
        a, b = four["tasks_per_s"]["median"], s16["tasks_per_s"]["median"]
        out.append((name, f"{b:,.0f} vs {a:,.0f} tasks/s ({b / a:.2f} x{how})", b >= 0.95 * a))
    else:
        out.append((name, *missing))

    name = f"(3) {multi}, 16 workers >= 600 tasks/s"
    v = m16["tasks_per_s"]["median"] if m16 else None
    out.append((name, *((f"{v:,.0f} tasks/s", v >= 600) if v is not None else missing)))

    if batch:
        v = batch["tasks_per_s"]["median"]
        out.append((f"(4) {batch['label']} >= 800 tasks/s", f"{v:,.0f} tasks/s", v >= 800))
    else:
        out.append(("(4) 1 run x 10000 tasks, 4 workers x concurrency 16 >= 800 tasks/s", *missing))

    pg = ((s4 or {}).get("cpu_ms_per_task") or {}).get("postgres") or {}
    name = f"(5) PostgreSQL CPU per task <= 2 ms ({single}, 4 workers)"
    if pg.get("median") is not None:
        out.append((name, f"{_ms(pg)} ms", pg["median"] <= 2.0))
    else:
        out.append((name, *missing))
    gw = (s4 or {}).get("gateway_cpu_ms_per_request") or {}
    name = f"(5) gateway CPU per request <= 0.5 ms ({single}, 4 workers)"
    if gw.get("median") is not None:
        out.append((name, f"{_ms(gw)} ms", gw["median"] <= 0.5))
    else:
        out.append((name, *missing))

    io = results.get("io_bound")
    name = "(issue 18) I/O-bound run on the default settings within 10% of the ideal time"
    if io and io.get("ratio_to_ideal") is not None:
        r = io["ratio_to_ideal"]
        out.append(
            (
                f"{name} ({io['tasks']:,} x {io['sleep_ms'] / 1000:g} s on {io['slots']} slots: {io['ideal_s']:g} s)",
                f"{io['span_s']['median']:.2f} s = {r:.3f} x ideal, peak {io['peak_concurrency']} at once",
                r <= 1.10,
            )
        )
    else:
        out.append((name, *missing))

    out += many_runs_targets(results, with_invariants=False)
    out += dynamic_targets(results)
    out += pacing_targets(results)
    out.append(_invariants_target(results))
    return out


def _invariants_target(
    results: dict[str, Any], name: str = "(5) every scenario ends with awp.check_invariants() empty"
) -> tuple[str, str, bool | None]:
    checked = [sc for sc in _scenarios(results) if sc.get("invariants") is not None]
    bad = [sc for sc in checked if sc["invariants"]["violations"]]
    if not checked:
        return (name, "not measured", None)
    if bad:
        worst = ", ".join(f"{sc['label']}: {sc['invariants']['violations']}" for sc in bad)
        return (name, f"{len(bad)} of {len(checked)} scenarios with violations ({worst})", False)
    return (name, f"{len(checked)} of {len(checked)} scenarios empty", True)


# ---- issue 46: many runs (benchmarks/many_runs.py) ------------------------------------------------------------

MANY_FACTOR = {True: 0.8, False: 0.6}  # runs of several tasks (1,000 x 10) / of one task (10,000 x 1), x the base
BACKLOG_MAX_RATIO = 1.2
PASS_MAX_MS = 20.0
STARTS_MIN_PER_S = 300.0
STARTS_CLIENTS = 8
LOG_MIN_RATIO = 0.9
PEER_46 = 1.5
PG_CPU_46_MS = 0.7


def _measured(scenario: dict[str, Any] | None) -> dict[str, Any] | None:
    return scenario if scenario and scenario.get("status") == "measured" else None


def _not_measured(scenario: dict[str, Any] | None) -> tuple[str, None]:
    if scenario and scenario.get("status") == "failed":
        return (f"FAILED: {scenario.get('error')}", None)
    return ("not measured", None)


def _shape(summary: dict[str, Any]) -> str:
    """A many-runs shape's short name: ``1,000 runs x 10 tasks``."""
    return str(summary.get("shape") or summary["label"].rsplit(", ", 1)[0])


def _base_shape(m: dict[str, Any]) -> dict[str, Any] | None:
    tp = _measured(m.get("throughput"))
    return next((s for s in tp["shapes"] if s.get("base")), None) if tp else None


def many_runs_targets(results: dict[str, Any], with_invariants: bool = True) -> list[tuple[str, str, bool | None]]:
    """The targets of issue 46 (measured, never asserted): (target, measured, met); met None when not measured."""
    plan = results["plan"]
    m = results.get("many_runs") or {}
    out: list[tuple[str, str, bool | None]] = []
    single = f"1 run x {plan['single_tasks']} tasks"
    s4 = _by_label_prefix(results, single, 4)  # step 2, beside the peer (absent in --many-runs-only)
    step2 = s4["tasks_per_s"]["median"] if s4 else None

    tp = _measured(m.get("throughput"))
    base = _base_shape(m)
    if tp and base:
        b = base["tasks_per_s"]["median"]
        for shape in (s for s in tp["shapes"] if not s.get("base")):
            factor = MANY_FACTOR[shape["tasks_per_run"] > 1]
            v = shape["tasks_per_s"]["median"]
            name = (
                f"(46) {shape['label']}, started in one transaction >= {factor} x tasks/s of "
                f"{_shape(base)} (repetitions alternating)"
            )
            also = f"; x step 2's {single}: {v / step2:.2f}" if step2 else ""
            out.append((name, f"{v:,.0f} vs {b:,.0f} tasks/s = {v / b:.2f} x{also}", v >= factor * b))
    else:
        for label, factor in (("1,000 runs x 10 tasks", 0.8), ("10,000 runs x 1 task", 0.6)):
            out.append(
                (
                    f"(46) {label}, 4 workers x 1 >= {factor} x tasks/s of 1 run x 1,000",
                    *_not_measured(m.get("throughput")),
                )
            )

    bl = _measured(m.get("backlog"))
    what = (
        f"backlog of {bl['ready_tasks']:,} ready tasks over {bl['backlog_runs']:,} runs"
        if bl
        else "backlog of 100,000 ready tasks over 1,000 runs"
    )
    name = f"(46) {what}: idle claim p50 (submit -> claimed) within {BACKLOG_MAX_RATIO} x of an empty queue"
    if bl and bl.get("claim_ratio") is not None:
        c = bl["claim_p50_ms"]
        out.append(
            (
                name,
                f"{c['backlog']:.1f} vs {c['empty']:.1f} ms = {bl['claim_ratio']:.2f} x",
                bl["claim_ratio"] <= BACKLOG_MAX_RATIO,
            )
        )
    else:
        out.append((name, *_not_measured(m.get("backlog"))))
    name = f"(46) {what}: PostgreSQL CPU per task within {BACKLOG_MAX_RATIO} x of an empty queue"
    if bl and bl.get("cpu_ratio") is not None:
        c = bl["pg_cpu_ms_per_task"]
        out.append(
            (
                f"{name} (1 run x {bl['workload_tasks']:,}, 4 workers)",
                f"{c['backlog']:.2f} vs {c['empty']:.2f} ms = {bl['cpu_ratio']:.2f} x",
                bl["cpu_ratio"] <= BACKLOG_MAX_RATIO,
            )
        )
    else:
        out.append((name, *_not_measured(m.get("backlog"))))

    cp = _measured(m.get("coordinator_pass"))
    name = (
        f"(46) coordinator pass with {cp['live_runs']:,} live runs and nothing to dispatch < {PASS_MAX_MS:g} ms (p50)"
        if cp
        else f"(46) coordinator pass with 10,000 live runs and nothing to dispatch < {PASS_MAX_MS:g} ms (p50)"
    )
    if cp:
        t3, t2 = cp["loaded"]["tick3"], cp["loaded"]["tick2"]
        p50 = t3["total_ms"]["p50"]
        no_slot = (cp.get("no_free_slot") or {}).get("tick3")
        also = f"; no worker at all: {no_slot['total_ms']['p50']:.2f} ms" if no_slot else ""
        out.append(
            (
                f"{name}; the runs' kind without a worker, 4 idle mock workers",
                f"{p50:.2f} ms with its commit ({t3['statement_ms']['p50']:.2f} ms the statement, p95 "
                f'{t3["total_ms"]["p95"]:.2f}); with "limited": {t2["total_ms"]["p50"]:.2f} ms{also}',
                p50 < PASS_MAX_MS,
            )
        )
    else:
        out.append((name, *_not_measured(m.get("coordinator_pass"))))

    st = _measured(m.get("starts"))
    name = f"(46) POST .../runs with {STARTS_CLIENTS} concurrent clients >= {STARTS_MIN_PER_S:g} runs/s"
    by_clients = {c["clients"]: c for c in st["clients"]} if st else {}
    if STARTS_CLIENTS in by_clients:
        r = by_clients[STARTS_CLIENTS]
        one_client = f"; 1 client: {by_clients[1]['runs_per_s']:,.0f}" if 1 in by_clients else ""
        errors = sum(n for code, n in r["statuses"].items() if code != "202")
        out.append(
            (
                name,
                f"{r['runs_per_s']:,.0f} runs/s ({r['started']:,} in {r['elapsed_s']:.1f} s, {errors} errors"
                f"{one_client})",
                r["runs_per_s"] >= STARTS_MIN_PER_S,
            )
        )
    else:
        out.append((name, *_not_measured(m.get("starts"))))

    lg = _measured(m.get("logging"))
    name = f"(46) default-level logs (INFO) cost <= 10%: INFO tasks/s >= {LOG_MIN_RATIO} x WARNING (alternating)"
    if lg and lg.get("ratio") is not None:
        i, w = (lg["levels"][k]["tasks_per_s"]["median"] for k in ("info", "warning"))
        pairs = ", ".join(f"{x:.2f}" for x in lg["pair_ratios"])
        out.append(
            (name, f"{i:,.0f} vs {w:,.0f} tasks/s = {lg['ratio']:.2f} x (pairs {pairs})", lg["ratio"] >= LOG_MIN_RATIO)
        )
    else:
        out.append((name, *_not_measured(m.get("logging"))))

    name = f"(46) {single}, 4 workers >= {PEER_46} x procrastinate (same run, same shape)"
    peer = _peer_rate(results)
    if step2 is not None and peer:
        out.append((name, f"{step2 / peer:.2f} x ({step2:,.0f} vs {peer:,.0f} tasks/s)", step2 / peer >= PEER_46))
    else:
        missing = _peer_missing(results) if step2 is not None else "no step 2 (the side by side) in this run"
        out.append((name, missing, None))

    pg = ((s4 or {}).get("cpu_ms_per_task") or {}).get("postgres") or {}
    where = f"{single}, 4 workers, step 2"
    if pg.get("median") is None and base:  # --many-runs-only: the base runs of scenario a, the same shape
        pg = (base.get("cpu_ms_per_task") or {}).get("postgres") or {}
        where = f"{_shape(base)}, 4 workers, the base of 'many runs'"
    name = f"(46) PostgreSQL CPU per task <= {PG_CPU_46_MS} ms ({where})"
    if pg.get("median") is not None:
        out.append((name, f"{_ms(pg)} ms", pg["median"] <= PG_CPU_46_MS))
    else:
        out.append((name, "not measured", None))
    if with_invariants:
        out.append(_invariants_target(results, "(46) every scenario ends with awp.check_invariants() empty"))
    return out


def many_runs_tables(results: dict[str, Any]) -> list[Table]:
    """The tables of issue 46's scenarios (benchmarks/many_runs.py); none when they did not run."""
    m = results.get("many_runs") or {}
    out: list[Table] = []
    step2 = _by_label_prefix(results, f"1 run x {results['plan']['single_tasks']} tasks", 4)
    tp = _measured(m.get("throughput"))
    base = _base_shape(m)
    if tp:
        t = Table(
            f"Many runs (issue 46): {tp['workers']} workers x concurrency 1, the runs started in one transaction, "
            "timed from its commit",
            [
                "scenario",
                "tasks/s",
                "min-max",
                "n",
                "x base",
                "start s (pg CPU s)",
                "commit -> last run started s",
                "PostgreSQL ms/task",
                "worker ms/task",
                "gateway ms/request",
                "requests/task",
                "claim ms p50/p95/p99",
            ],
        )
        b = base["tasks_per_s"]["median"] if base else None
        for shape in tp["shapes"]:
            v = shape["tasks_per_s"]["median"]
            cpu = shape.get("cpu_ms_per_task") or {}
            reps = shape.get("repetitions") or []
            requests = sum(x.get("requests", 0) for x in reps)
            tasks = sum(x.get("tasks", 0) for x in reps)
            t.add(
                shape["label"] + (" (base)" if shape.get("base") else ""),
                _f(v),
                _spread(shape["tasks_per_s"]),
                shape["tasks_per_s"]["n"],
                f"{v / b:.2f}" if b else "-",
                f"{_f(shape['start_s']['median'], 2)} ({_f(shape['start_pg_cpu_s']['median'], 2)})",
                _f(shape["last_start_s"]["median"], 2),
                _ms(cpu.get("postgres")),
                _ms(cpu.get("workers")),
                _ms(shape.get("gateway_cpu_ms_per_request")),
                f"{requests / tasks:.2f}" if tasks and requests else "-",
                _pcts(shape["latency_ms"]["claim"]),
            )
        t.notes.append(
            "Rounds alternate (base, then the others, then backwards): x base divides by the median of the base run"
            " measured in the same minutes."
        )
        if step2 and b:
            t.notes.append(
                f"Step 2's {step2['label']} (beside procrastinate, earlier in this run): "
                f"{step2['tasks_per_s']['median']:,.0f} tasks/s; the base here: {b:,.0f}."
            )
        t.notes.append(
            "Start: the one transaction (awp.start_runs, 1,000 runs a call) to its commit, and PostgreSQL's CPU in"
            " it; CPU per task and tasks/s count from the commit. Claims: the claim route's durations (long-polls"
            " included)."
        )
        out.append(t)
    bl = _measured(m.get("backlog"))
    if bl:
        t = Table(
            f"Backlog (issue 46): {bl['ready_tasks']:,} ready '{bl.get('idle_kind', 'python')}' tasks over "
            f"{bl['backlog_runs']:,} runs that no worker serves, against an empty queue",
            ["measure", "empty queue", "backlog", "empty, after", "backlog / empty"],
        )
        ph = bl["phases"]

        def row(name: str, get: Any, digits: int, ratio: float | None) -> None:
            t.add(name, *(_f(get(ph[k]), digits) for k in ("empty", "backlog", "empty_after")), _f(ratio, 2))

        row("idle claim p50 ms (submit -> claimed)", lambda p: p["claim_ms"]["p50"], 1, bl["claim_ratio"])
        row("idle claim p95 ms", lambda p: p["claim_ms"]["p95"], 1, None)
        row("idle: submit -> dispatch created p50 ms", lambda p: p["dispatch_ms"]["p50"], 1, None)
        row(
            f"1 run x {bl['workload_tasks']:,}: tasks/s (median)",
            lambda p: p["tasks_per_s"]["median"],
            0,
            _ratio(ph["backlog"]["tasks_per_s"]["median"], ph["empty"]["tasks_per_s"]["median"]),
        )
        row(
            f"1 run x {bl['workload_tasks']:,}: PostgreSQL CPU ms/task (median)",
            lambda p: p["pg_cpu_ms_per_task"]["median"],
            2,
            bl["cpu_ratio"],
        )
        row(
            f"1 run x {bl['workload_tasks']:,}: gateway CPU ms/task (median)",
            lambda p: (p.get("gateway_cpu_ms_per_task") or {}).get("median"),
            2,
            None,
        )
        c = bl["cleanup"]
        t.notes += [
            f"{bl['samples']} idle claims (1-task runs, one at a time, 0.2 s apart) and "
            f"{ph['empty']['tasks_per_s']['n']} runs of {bl['workload_tasks']:,} tasks per phase. The ratios divide by"
            " the two empty-queue phases pooled (claims: every sample; CPU: every repetition).",
            f"The backlog: {bl['backlog_runs']:,} runs of {bl['backlog_tasks']} tasks started in one transaction in "
            f"{bl['create_s']:.2f} s; canceled by awp.cancel_waiting_runs in {c['calls']} calls, {c['s']:.2f} s.",
        ]
        out.append(t)
    cp = _measured(m.get("coordinator_pass"))
    if cp:
        t = Table(
            "Coordinator pass (issue 46): awp.coordinator_tick from this harness, each pass in its own transaction"
            " (ms)",
            [
                "live runs",
                "workers",
                "form",
                "p50 with commit",
                "p95 with commit",
                "p50 statement",
                "samples",
                "dispatched",
            ],
            right={0, 3, 4, 5, 6, 7},
        )
        situations = [
            (cp["live_runs_before"], "4 idle (mock)", cp["no_live_runs"]),
            (cp["live_runs"], "4 idle (mock)", cp["loaded"]),
            (cp["live_runs"], "none", cp.get("no_free_slot")),
        ]
        for live, workers, passes in situations:
            if not passes:
                continue
            for key, form in (("tick3", "(false, NULL, false)"), ("tick2", '() with "limited"')):
                x = passes[key]
                t.add(
                    f"{live:,}",
                    workers,
                    form,
                    _f(x["total_ms"]["p50"], 2),
                    _f(x["total_ms"]["p95"], 2),
                    _f(x["statement_ms"]["p50"], 2),
                    x["total_ms"]["n"],
                    x["dispatched"],
                )
        gw = cp["gateway_passes"]
        t.notes += [
            f"{cp['runs']:,} runs of one '{cp.get('idle_kind', 'python')}' task (no worker of that kind; 4 idle mock"
            f" workers with free slots), started in one transaction in {cp['create_s']:.2f} s; canceled in "
            f"{cp['cleanup']['calls']} calls, {cp['cleanup']['s']:.2f} s.",
            f"The gateway's own passes meanwhile (its coordinator, every second; /metrics): {gw['passes']:.0f}, mean "
            f"{_f(gw['mean_ms'], 2)} ms.",
        ]
        for what, passes in (("4 idle mock workers", cp["loaded"]), ("no worker", cp.get("no_free_slot") or {})):
            if passes.get("profile"):
                t.notes.append(
                    f"Where a (false, NULL, false) pass's time goes with {cp['live_runs']:,} live runs, {what} "
                    "(self time of the awp functions, median of 5 more passes under track_functions, whose timing makes"
                    " them slower than the timed ones): "
                    + ", ".join(f"{x['function']} {x['self_ms']:.2f} ms" for x in passes["profile"])
                    + "."
                )
        out.append(t)
    lg = _measured(m.get("logging"))
    if lg:
        t = Table(
            "Logging (issue 46): the gateway and the workers at INFO (default) or WARNING, repetitions alternating",
            [
                "logs at",
                "tasks/s",
                "min-max",
                "n",
                "gateway CPU ms/task",
                "worker CPU ms/task",
                "PostgreSQL CPU ms/task",
                "log bytes/task gw/wk",
            ],
        )
        for level in ("info", "warning"):
            x = lg["levels"][level]
            cpu = x.get("cpu_ms_per_task") or {}
            t.add(
                level.upper(),
                _f(x["tasks_per_s"]["median"]),
                _spread(x["tasks_per_s"]),
                x["tasks_per_s"]["n"],
                _ms(cpu.get("gateway")),
                _ms(cpu.get("workers")),
                _ms(cpu.get("postgres")),
                "/".join(_f((x.get("log_bytes_per_task") or {}).get(k)) for k in ("gateway", "workers")),
            )
        t.notes += [
            f"INFO / WARNING = {_f(lg['ratio'], 2)} (medians); per pair: "
            + ", ".join(f"{x:.2f}" for x in lg["pair_ratios"])
            + f". Order: {', '.join(x.upper() for x in lg['order'])}.",
            "Before every repetition the gateway and the 4 workers are restarted at that level, then an untimed warm-up"
            " run. awp serve has no log-level option: both levels start it through a wrapper that sets its 'awp'"
            " loggers' level (benchmarks/procs.py); the workers take --log-level.",
        ]
        out.append(t)
    st = _measured(m.get("starts"))
    if st:
        t = Table(
            "Run starts through HTTP (issue 46): POST /api/v1/workflows/{id}/versions/{v}/runs, a 1-task workflow,"
            " no worker",
            [
                "clients",
                "runs/s",
                "started",
                "other answers",
                "ms p50/p95/p99",
                "runs/s (database clock)",
                "gateway CPU ms/request",
                "PostgreSQL CPU ms/request",
                "client CPU ms/request",
            ],
        )
        for r in st["clients"]:
            cpu = r["cpu_ms_per_request"]
            others = {k: v for k, v in r["statuses"].items() if k != "202"}
            t.add(
                r["clients"],
                _f(r["runs_per_s"]),
                f"{r['started']:,}",
                ", ".join(f"{k}: {v}" for k, v in others.items()) or "none",
                _pcts(r["latency_ms"]),
                _f(r.get("db_runs_per_s")),
                _f(cpu["gateway"], 2),
                _f(cpu["postgres"], 2),
                _f(cpu["client"], 2),
            )
        t.notes += [
            f"Each client: one kept connection (aiohttp, in the harness's process), a new Idempotency-Key per request,"
            f" {st['seconds']:g} s. runs/s: 202 answers over the clients' time; the database clock's: runs created over"
            " first -> last created_at.",
            f"Then the {st['runs_total']:,} runs so started were canceled (awp.cancel_waiting_runs) in "
            f"{st['cleanup']['calls']} calls, {st['cleanup']['s']:.2f} s.",
        ]
        out.append(t)
    failed = [s for s in m.values() if s.get("status") == "failed"]
    if failed:
        t = Table("Issue 46 scenarios that FAILED", ["scenario", "error"], right=set())
        for s in failed:
            t.add(s["label"], s.get("error", ""))
        out.append(t)
    return out


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def many_runs_text(results: dict[str, Any]) -> str:
    """``run.py --many-runs-only``: its header, the tables of issue 46, the invariants and its targets."""
    m, pg, plan = results["machine"], results["postgres"], results["plan"]
    head = [
        f"AWP benchmark, issue 46 scenarios only ({plan['name']}), {results['started_at']}, "
        f"{results['elapsed_s']:.0f} s",
        f"machine: {m.get('cpus')} CPUs ({m.get('cpu_model', '?')}), load at start {m.get('loadavg_at_start')}",
        f"PostgreSQL {pg['server_version']}, fsync={pg['fsync']}, shared_buffers={pg['shared_buffers']}",
        *(f"PROBLEM: {p}" for p in results.get("problems") or []),
    ]
    t_tgt = Table("Targets of issue 46 (measured, not asserted)", ["target", "measured", "result"], right=set())
    for name, measured, met in many_runs_targets(results):
        t_tgt.add(name, measured, "NOT MEASURED" if met is None else ("PASS" if met else "MISS"))
    if plan["name"] != "full":
        t_tgt.notes.append("Quick run: smaller sizes than the targets name and fewer repetitions; indicative only.")
    tabs = [*many_runs_tables(results), _invariants_table(results), t_tgt]
    return "\n".join(head) + "\n\n" + "\n\n".join(t.text() for t in tabs if t is not None) + "\n"


# ---- tables -----------------------------------------------------------------------------------------------


def tables(results: dict[str, Any]) -> list[Table]:
    ref = results.get("reference") or {}
    limit = ref.get(REF_LIMIT, {}).get("median")

    t_ref = Table(
        "Reference: plain-SQL SKIP LOCKED claim + complete (pgbench, 2 transactions per job, same cluster)",
        ["clients", "jobs/s (median)", "min-max", "runs"],
    )
    for clients, r in ref.items():
        t_ref.add(clients, _f(r["median"]), _spread(r), r["n"])
    t_ref.notes.append(f"The {REF_LIMIT}-client figure is taken as this machine's limit: 'x ref' below divides by it.")
    t_ref.notes.append(
        f"The {REF_PEER}-client figure is the side-by-side table's reference (as many clients as workers)."
    )

    t = Table(
        "Throughput through HTTP (tasks/s from database timestamps: first run start -> last run end)",
        [
            "scenario",
            "tasks/s",
            "min-max",
            "n",
            "x ref",
            "claim ms p50/p95/p99",
            "heartbeat ms p50/p95/p99",
            "complete ms p50/p95/p99",
            "completions (batch) ms p50/p95/p99",
            "empty claims/task",
            "coord. dispatch share",
            "CPU s gw/wk/pg",
            "peak RSS MB gw/wk",
        ],
        right=set(range(1, 13)),
    )
    for r in results.get("throughput", []):
        med = r["tasks_per_s"]["median"]
        cpu = r["cpu_s"]
        t.add(
            r["label"],
            _f(med),
            _spread(r["tasks_per_s"]),
            r["tasks_per_s"]["n"],
            f"{med / limit:.2f}" if limit else "-",
            _pcts(r["latency_ms"]["claim"]),
            _pcts(r["latency_ms"]["heartbeat"]),
            _pcts(r["latency_ms"]["complete"]),
            _pcts(r["latency_ms"].get("completions", {})),
            f"{r['claims']['empty_per_task']:.3f}",
            f"{r['coordinator']['dispatched_share']:.2f}",
            "/".join(_f(cpu[k], 1) for k in ("gateway", "workers", "postgres")),
            f"{r['peak_rss_mb']['gateway']:.0f}/{r['peak_rss_mb']['workers']:.0f}",
        )
    t.notes += [
        "tasks/s: median of n repetitions, spread min-max. Latencies: every request of every repetition, from the",
        "gateway's access log; a claim includes its long-poll wait. CPU: seconds per repetition (median) of the",
        "gateway, all workers, all PostgreSQL processes. Peak RSS: VmHWM, the largest gateway / worker process.",
        "Coord. dispatch share: dispatches created by coordinator passes per task (the rest inline, in the same",
        "transaction as start_run / complete_task).",
    ]

    t_pub = Table(f"Peers ({PUBLISHED_NOTE})", ["source", "1 worker", "4 workers", "16 workers"])
    for source, figs in PUBLISHED:
        t_pub.add(source, *(_f(figs.get(k), 1) for k in ("1 worker", "4 workers", "16 workers")))
    if _peer_rate(results):
        t_pub.notes.append("For context only: procrastinate is measured in this run (the side-by-side table).")
    else:
        t_pub.notes.append(_peer_missing(results) + ": these published figures are NOT a measurement.")

    out = [side_by_side(results), t_ref, t, cpu_table(results), t_pub]
    lat = results.get("latency")
    if lat:
        t_lat = Table(
            "Latency, idle system (database clock, from the run's creation)",
            ["measure", "p50 ms", "p95 ms", "samples"],
        )
        if "dispatch_ms" in lat:
            t_lat.add(
                "submit -> dispatch created",
                _f(lat["dispatch_ms"]["p50"], 1),
                _f(lat["dispatch_ms"]["p95"], 1),
                lat["samples"],
            )
        t_lat.add(
            "submit -> claimed (attempt started)",
            _f(lat["claim_ms"]["p50"], 1),
            _f(lat["claim_ms"]["p95"], 1),
            lat["samples"],
        )
        t_lat.add(
            "submit -> finished (run finished)",
            _f(lat["finish_ms"]["p50"], 1),
            _f(lat["finish_ms"]["p95"], 1),
            lat["samples"],
        )
        t_lat.notes.append(lat["label"] + "; one run at a time, 0.2 s apart.")
        coord = lat.get("coordinator") or {}
        if coord:
            t_lat.notes.append(
                f"Dispatches created by the coordinator (not inline by start_run): {coord['dispatched']:.0f} of "
                f"{lat['samples']}."
            )
        out.append(t_lat)
    if results.get("recovery"):
        t_rec = Table(
            "Recovery: kill -9 of the worker holding a lease -> next attempt claimed (database clock)",
            ["lease / heartbeat", "takeover s (median)", "min-max", "attempt 1 settled s", "runs"],
        )
        for r in results["recovery"]:
            tk, dt_ = r["takeover_ms"], r["detected_ms"]
            t_rec.add(
                f"{r['label']}: {r['lease_ms'] / 1000:g} s / {r['heartbeat_ms'] / 1000:g} s",
                _f(tk["median"] / 1000, 2),
                f"{tk['min'] / 1000:.2f}-{tk['max'] / 1000:.2f}",
                _f(dt_["median"] / 1000, 2),
                tk["n"],
            )
        t_rec.notes.append("Killed at a random point of the heartbeat cycle; coordinator interval as in the settings.")
        out.append(t_rec)
    if results.get("io_bound"):
        out.append(io_table(results["io_bound"]))
    ret = results.get("retention")
    if ret:
        t_ret = Table(
            "Retention: /metrics cost by finished runs stored (median), and pruning",
            ["finished runs", "metrics_snapshot ms", "GET /metrics ms", "counting every run (before) ms"],
            right={0, 1, 2, 3},
        )
        for s in ret["sizes"]:
            t_ret.add(
                f"{s['finished_runs']:,}",
                _f(s["metrics_snapshot_ms"], 2),
                _f(s["scrape_ms"], 2),
                _f(s["count_all_runs_ms"], 2),
            )
        b, p = ret["full_batch"], ret["prune_all"]
        t_ret.notes.append(
            f"One prune batch: {b['runs']} runs ({b['tasks']} tasks, {b['attempts']} attempts, {b['events']} events) "
            f"in {b['ms']} ms. awp.prune('0') deleted {p['runs']:,} runs in {p['calls']} calls, {p['s']} s."
        )
        out.append(t_ret)
    for r in results.get("throughput", []):
        if r.get("profile"):
            t_prof = Table(
                f"Profile (pg_stat_statements, track = all; nested statements included): {r['label']}",
                ["top", "calls", "total ms", "mean ms", "ms/task", "statement"],
                right={1, 2, 3, 4},
            )
            for p in r["profile"]:
                t_prof.add(
                    "yes" if p["toplevel"] else "no",
                    p["calls"],
                    _f(p["total_ms"]),
                    _f(p["mean_ms"], 3),
                    _f(p["ms_per_task"], 3),
                    p["query"],
                )
            out.append(t_prof)
    out += many_runs_tables(results)
    if results.get("dynamic"):
        out.append(dynamic_table(results))
    if results.get("pacing"):
        out.append(pacing_table(results))
    t_inv = _invariants_table(results)
    if t_inv is not None:
        out.append(t_inv)
    t_tgt = Table(
        "Targets of issues 11, 18, 46, 39 and 40 (measured, not asserted)",
        ["target", "measured", "result"],
        right=set(),
    )
    for name, measured, met in targets(results):
        t_tgt.add(name, measured, "NOT MEASURED" if met is None else ("PASS" if met else "MISS"))
    if results["plan"]["name"] != "full":
        t_tgt.notes.append(
            "Quick run: smaller sizes than the targets name and fewer repetitions (see n); indicative only."
        )
    out.append(t_tgt)
    return out


def dynamic_targets(results: dict[str, Any]) -> list[tuple[str, str, bool | None]]:
    """(target, measured, met): issue 39's for_each target (benchmarks/dynamic.py; met None when not measured)."""
    d = results.get("dynamic")
    n = (d or {}).get("items") or results.get("plan", {}).get("dynamic_items", 5000)
    name = f"(issue 39) 1 run with a for_each over {n:,} items >= 0.8 x a static {n:,}-task run (4 workers x 16)"
    if not d or d.get("ratio") is None:
        return [(name, "not measured", None)]
    e, s = d["for_each"]["tasks_per_s"]["median"], d["static"]["tasks_per_s"]["median"]
    return [(name, f"{d['ratio']:.2f} x ({e:,.0f} vs {s:,.0f} tasks/s)", d["ratio"] >= 0.8)]


def dynamic_table(results: dict[str, Any]) -> Table:
    """Step 10 (issue 39, benchmarks/dynamic.py): the for_each run beside the static one, rounds alternating."""
    d = results.get("dynamic") or {}
    t = Table(
        "Dynamic workflows (issue 39): for_each against a static run, rounds alternating",
        ["scenario", "tasks/s (median, spread)", "n", "PostgreSQL ms/task", "for_each / static"],
        right={1, 2, 3, 4},
    )
    for key in ("static", "for_each"):
        sc = d.get(key)
        if not sc:
            continue
        pg = (sc.get("cpu_ms_per_task") or {}).get("postgres") or {}
        ratio = (
            f"{d['ratio']:.2f} x (pairs {', '.join(f'{p:.2f}' for p in d.get('pairs') or [])})"
            if key == "for_each" and d.get("ratio")
            else ""
        )
        t.add(sc["label"], _spread(sc["tasks_per_s"]), sc["tasks_per_s"].get("n", ""), _ms(pg) if pg else "-", ratio)
    return t


def pacing_targets(results: dict[str, Any]) -> list[tuple[str, str, bool | None]]:
    """(target, measured, met): issue 40's rate-limit targets (benchmarks/pacing.py; met None when not measured)."""
    p = results.get("pacing") or {}
    a, w = p.get("in_flight"), p.get("per_window")
    out: list[tuple[str, str, bool | None]] = []
    name = "(issue 40) a run behind max_in_flight 50 on 200 slots keeps exactly 50 in flight (sampled)"
    if a and a.get("steady_at_limit") is not None:
        measured = (
            f"peak {a['peak']}, {a['steady_at_limit']:.1%} of {a['steady_samples']} samples at 50"
            f" (min {a['steady_min']})"
        )
        out.append((name, measured, a["peak"] == a["max_in_flight"] and a["steady_at_limit"] >= 0.95))
    else:
        out.append((name, "not measured", None))
    name = "(issue 40) per_window 100 per second holds within 1% over 20 s"
    if w:
        measured = (
            f"{w['rate_per_s']:.1f}/s over {w['measure_s']:.0f} s ({w['rate_ratio']:.3f} x), "
            f"busiest window {w['busiest_window']}"
        )
        # Holds: never over the limit (every window, and the rate at most 1% above it). The rate under it is the
        # limit / (1 + the lag from a start leaving the window to the next lease), shown, not a target.
        out.append((name, measured, w["busiest_window"] <= w["per_window"] and w["rate_ratio"] <= 1.01))
    else:
        out.append((name, "not measured", None))
    return out


def pacing_table(results: dict[str, Any]) -> Table:
    """Step 11 (issue 40, benchmarks/pacing.py): the two rules of a named rate limit under load."""
    p = results.get("pacing") or {}
    t = Table("Rate limits (issue 40): max_in_flight and per_window under load", ["scenario", "measured"], right=set())
    a, w = p.get("in_flight"), p.get("per_window")
    if a:
        t.add(
            a["label"],
            f"peak {a['peak']} in flight; {_f(100 * (a['steady_at_limit'] or 0), 1)}% of {a['steady_samples']} samples "
            f"at the limit (min {a['steady_min']}); {_f(a['tasks_per_s'] or 0, 0)} tasks/s"
            f" (ideal {a['ideal_tasks_per_s']:.0f})",
        )
    if w:
        t.add(
            w["label"],
            f"{w['starts']} starts: {w['rate_per_s']:.1f}/s ({w['rate_ratio']:.3f} x); busiest {w['window_ms']} ms "
            f"window {w['busiest_window']} (limit {w['per_window']})",
        )
    return t


def _invariants_table(results: dict[str, Any]) -> Table | None:
    checked = [sc for sc in _scenarios(results) if sc.get("invariants") is not None]
    if checked:
        t_inv = Table(
            "awp.check_invariants() at the end of each scenario (whole database, every run so far; issue 46: its runs)",
            ["scenario", "rows", "violated invariants"],
            right={1},
        )
        for sc in checked:
            inv = sc["invariants"]
            t_inv.add(
                sc["label"],
                inv["violations"],
                ", ".join(f"{k}: {n}" for k, n in inv["by_invariant"].items()) or "none",
            )
        t_inv.notes.append("The first rows of each non-empty check (with run ids) are in the JSON: invariants.sample.")
        if any("runs_checked" in sc["invariants"] for sc in checked):
            t_inv.notes.append(
                "Issue 46's scenarios check their own runs (awp.check_invariants(run_ids), 1,000 runs a call, each call"
                " with the global checks): a whole-database call costs runs x tasks there."
            )
        return t_inv
    return None


def io_table(io: dict[str, Any]) -> Table:
    """The I/O-bound scenario of issue 18: time against the ideal (tasks x sleep / slots), default settings."""
    t = Table(
        f"I/O-bound on the default settings (dispatch_limit {io['dispatch_limit']}): time vs the ideal",
        ["scenario", "s (median)", "min-max", "ideal s", "x ideal", "peak at once", "runs"],
    )
    span = io["span_s"]
    t.add(
        io["label"],
        _f(span["median"], 2),
        f"{_f(span['min'], 2)}-{_f(span['max'], 2)}",
        _f(io["ideal_s"], 1),
        _f(io["ratio_to_ideal"], 3),
        io["peak_concurrency"],
        span["n"],
    )
    waits: dict[str, int] = {}
    for rep in io.get("repetitions") or []:
        for reason, n in (rep.get("max_waiting_by_reason") or {}).items():
            waits[reason] = max(waits.get(reason, 0), n)
    t.notes.append(
        "Ideal: every slot busy from the run's start to its end (tasks x sleep / slots); target: within 10%. The run"
        " start to finish on the database clock; peak: the most attempts running at once (from their timestamps)."
    )
    if waits:
        t.notes.append(
            "What held the waiting tasks (awp.run_waits, sampled every 0.5 s; the most at once): "
            + ", ".join(f"{k} {v:,}" for k, v in sorted(waits.items(), key=lambda kv: -kv[1]))
            + "."
        )
    return t


def side_by_side(results: dict[str, Any]) -> Table:
    """AWP vs procrastinate vs the plain-SQL reference, in AWP's single-run 4-worker shape."""
    plan = results["plan"]
    n = plan["single_tasks"]
    peer = results.get("peer") or {}
    workers = peer.get("workers", 4)
    conc = peer.get("worker_concurrency", 1)
    awp = _by_label_prefix(results, f"1 run x {n} tasks", workers)
    ref = (results.get("reference") or {}).get(REF_PEER)
    t = Table(
        f"AWP vs procrastinate vs plain-SQL reference: {n} no-op tasks, {workers} worker processes x concurrency "
        f"{conc}, same cluster, same run",
        [
            "system",
            "tasks/s",
            "min-max",
            "n",
            "AWP / this",
            "PostgreSQL CPU ms/task",
            "worker CPU ms/task",
            "gateway CPU ms/request",
            "gateway CPU ms/task",
            "cores busy",
        ],
    )
    cpus = (results.get("machine") or {}).get("cpus")
    a = awp["tasks_per_s"]["median"] if awp else None

    def ratio(v: float | None) -> str:
        return f"{a / v:.2f}" if a is not None and v else "-"

    if awp:
        cpu = awp.get("cpu_ms_per_task") or {}
        t.add(
            f"AWP: 1 run x {n} tasks, awp serve + {workers} x awp worker (HTTP)",
            _f(a),
            _spread(awp["tasks_per_s"]),
            awp["tasks_per_s"]["n"],
            "1.00",
            _ms(cpu.get("postgres")),
            _ms(cpu.get("workers")),
            _ms(awp.get("gateway_cpu_ms_per_request")),
            _ms(cpu.get("gateway")),
            _busy(awp.get("repetitions") or [], cpus),
        )
    else:
        t.add(f"AWP: 1 run x {n} tasks, {workers} workers", "NOT MEASURED", "-", "-", "-", "-", "-", "-", "-", "-")
    p = _peer_rate(results)
    if p:
        cpu = peer["cpu_ms_per_task"]
        t.add(
            f"procrastinate {peer['version']}: {peer['jobs']} jobs, {workers} worker processes ({peer['connector']})",
            _f(p),
            _spread(peer["tasks_per_s"]),
            peer["tasks_per_s"]["n"],
            ratio(p),
            _ms(cpu.get("postgres")),
            _ms(cpu.get("workers")),
            "n/a",
            "n/a",
            _busy(peer.get("repetitions") or [], cpus),
        )
    else:
        t.add(
            f"procrastinate {peer.get('version') or ''}".rstrip(),
            "NOT MEASURED",
            "-",
            "-",
            "-",
            "-",
            "-",
            "n/a",
            "n/a",
            "-",
        )
        t.notes.append(_peer_missing(results))
    if ref:
        t.add(
            f"plain SQL: SKIP LOCKED claim + complete, pgbench, {REF_PEER} clients",
            _f(ref["median"]),
            _spread(ref),
            ref["n"],
            ratio(ref["median"]),
            "-",
            "-",
            "n/a",
            "n/a",
            "-",
        )
    else:
        t.add(f"plain SQL, pgbench, {REF_PEER} clients", "NOT MEASURED", "-", "-", "-", "-", "-", "n/a", "n/a", "-")
    t.notes += [
        f"AWP / procrastinate = {ratio(p)}; AWP / plain-SQL reference ({REF_PEER} clients) = "
        f"{ratio(ref['median'] if ref else None)} (medians).",
        "Windows, all on the database clock, start-up excluded: AWP from the run's start to its finish (workers",
        "already long-polling); procrastinate from the first 'started' to the last 'succeeded' event of",
        "procrastinate_events, the jobs deferred up front in a transaction committed once all workers are",
        "registered and LISTENing; reference: first claim to last completion of the jobs done in the pgbench run.",
        "CPU (utime + stime from /proc), per repetition, median (min-max): every PostgreSQL process of the cluster",
        "(also the backends that exited), the worker processes, the gateway (with its coordinator) per HTTP request",
        "of any route in the window. The reference's CPU is not measured.",
        "Cores busy: that CPU (every process measured) over the window x this machine's cores, per repetition (the CPU",
        "is read just around the window: a little high). Below 100% the cores waited: AWP's one run is paced by its",
        "chain of calls (docs/performance.md, Where one run's throughput goes).",
    ]
    pairs = _pair_ratios(awp, peer)
    if pairs:
        t.notes.append(
            "AWP's and procrastinate's repetitions alternate (procrastinate, AWP, AWP, procrastinate, ...; AWP's "
            "workers stopped during procrastinate's): AWP / procrastinate per pair "
            + ", ".join(f"{r:.2f}" for r in pairs)
            + "."
        )
    return t


def _pair_ratios(awp: dict[str, Any] | None, peer: dict[str, Any]) -> list[float]:
    """AWP / peer per pair of alternating repetitions (benchmarks/run.py, step 2); [] if they did not alternate."""
    if not awp or not awp.get("beside_peer") or peer.get("status") != "measured":
        return []
    mine = [r["tasks_per_s"] for r in awp.get("repetitions", [])]
    theirs = [r["tasks_per_s"] for r in peer.get("repetitions", [])]
    return [a / p for a, p in zip(mine, theirs, strict=False) if p]


def cpu_table(results: dict[str, Any]) -> Table:
    t = Table(
        "CPU per task by process kind (ms, per repetition: median (min-max))",
        ["scenario", "PostgreSQL ms/task", "worker ms/task", "gateway ms/task", "gateway ms/request", "requests/task"],
    )
    for r in results.get("throughput", []):
        cpu = r.get("cpu_ms_per_task") or {}
        reps = r.get("repetitions") or []
        requests = sum(x.get("requests", 0) for x in reps)
        tasks = sum(x.get("tasks", 0) for x in reps)
        t.add(
            "AWP: " + r["label"],
            _ms(cpu.get("postgres")),
            _ms(cpu.get("workers")),
            _ms(cpu.get("gateway")),
            _ms(r.get("gateway_cpu_ms_per_request")),
            f"{requests / tasks:.2f}" if tasks and requests else "-",
        )
    peer = results.get("peer") or {}
    if peer.get("status") == "measured":
        cpu = peer["cpu_ms_per_task"]
        t.add(f"procrastinate: {peer['label']}", _ms(cpu.get("postgres")), _ms(cpu.get("workers")), "n/a", "n/a", "-")
    t.notes.append("requests/task: HTTP requests of every route (claims, heartbeats, completions, ...) per task.")
    return t


def header(results: dict[str, Any]) -> list[str]:
    m, pg, s = results["machine"], results["postgres"], results["settings"]
    plan = results["plan"]
    return [
        f"AWP benchmark ({plan['name']}), {results['started_at']}, {results['elapsed_s']:.0f} s",
        f"machine: {m.get('cpus')} CPUs ({m.get('cpu_model', '?')}), load at start {m.get('loadavg_at_start')}, "
        f"Python {m.get('python')}",
        f"PostgreSQL {pg['server_version']}, fsync={pg['fsync']}, synchronous_commit={pg['synchronous_commit']}, "
        f"shared_buffers={pg['shared_buffers']}; one fresh throwaway cluster and database",
        f"settings (defaults): lease {s['lease_duration_ms']} ms, heartbeat {s['heartbeat_interval_ms']} ms, "
        f"dispatch_limit {s['dispatch_limit']}, coordinator interval {s['coordinator_interval_ms']} ms, "
        f"claim re-check {s['claim_recheck_ms']} ms, gateway pool {s['gateway_pool_size']}, "
        f"worker wait_ms {s['worker_wait_ms']}; run concurrency = total worker slots; "
        f"mock tasks with sleep_ms 0",
        *(f"PROBLEM: {p}" for p in results.get("problems") or []),
    ]


def text(results: dict[str, Any]) -> str:
    return "\n".join(header(results)) + "\n\n" + "\n\n".join(t.text() for t in tables(results)) + "\n"


def markdown(results: dict[str, Any]) -> str:
    head = header(results)
    intro = head[0] + "\n\n" + "\n".join(f"- {h}" for h in head[1:])
    return "\n\n".join([intro, *(t.markdown() for t in tables(results))]) + "\n"


# ---- chart ------------------------------------------------------------------------------------------------


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


# ---- files ------------------------------------------------------------------------------------------------


def write(results: dict[str, Any], out: Path, when: dt.datetime) -> None:
    out.mkdir(parents=True, exist_ok=True)
    results["targets"] = [{"target": a, "measured": b, "met": c} for a, b, c in targets(results)]
    stamp = when.strftime("%Y%m%dT%H%M%SZ")
    body = json.dumps(results, indent=2, default=str) + "\n"
    path = out / f"bench-{results['plan']['name']}-{stamp}.json"
    path.write_text(body)
    shutil.copyfile(path, out / "latest.json")
    (out / "latest.md").write_text(markdown(results))
    chart(results, out / "latest.png")
    print()
    print(text(results))
    print(f"results: {path}, {out / 'latest.json'}, {out / 'latest.md'}, {out / 'latest.png'}")
