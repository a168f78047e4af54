"""The verdicts of a benchmark's results (``report.py``): the targets of issues 11, 18, 46, 39 and 40 (measured,
never asserted: met, missed or not measured), the lookups they share with the tables, and the problems that make
``run.py``'s exit status 1."""

from __future__ import annotations

from typing import Any

from report_format import _ms

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


# ---- issue 39: dynamic workflows (benchmarks/dynamic.py) --------------------------------------------------


def dynamic_targets(results: dict[str, Any]) -> list[tuple[str, str, bool | None]]:
    """(target, measured, met): issue 39's for_each target (benchmarks/dynamic.py; met None when not measured)."""
    d = results.get("dynamic")
    n = (d or {}).get("items") or results.get("plan", {}).get("dynamic_items", 5000)
    name = f"(issue 39) 1 run with a for_each over {n:,} items >= 0.8 x a static {n:,}-task run (4 workers x 16)"
    if not d or d.get("ratio") is None:
        return [(name, "not measured", None)]
    e, s = d["for_each"]["tasks_per_s"]["median"], d["static"]["tasks_per_s"]["median"]
    return [(name, f"{d['ratio']:.2f} x ({e:,.0f} vs {s:,.0f} tasks/s)", d["ratio"] >= 0.8)]


# ---- issue 40: rate limits (benchmarks/pacing.py) ---------------------------------------------------------


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


# ---- problems ---------------------------------------------------------------------------------------------


def problems(results: dict[str, Any]) -> list[str]:
    """What makes the benchmark's exit status 1: a failed peer, a violated invariant."""
    out = []
    peer = results.get("peer") or {}
    if peer.get("status") == "failed":
        out.append(f"peer {peer.get('name')}: {peer.get('error')}")
    scenarios = [
        *results.get("throughput", []),
        *([results["latency"]] if results.get("latency") else []),
        *([results["io_bound"]] if results.get("io_bound") else []),
        *results.get("recovery", []),
        *(results.get("many_runs") or {}).values(),
        *(v for k, v in (results.get("dynamic") or {}).items() if k in ("static", "for_each")),
        *(results.get("pacing") or {}).values(),
        *(s[k] for s in (results.get("progress") or {}).get("shapes", []) for k in ("none", "logs")),
    ]
    step13 = results.get("sharded") or {}
    if step13.get("status") == "failed":
        out.append(f"sharded (step 13): FAILED: {step13.get('error')}")
    elif (step13.get("invariants") or {}).get("violations"):
        out.append(f"sharded (step 13): awp.check_invariants() returned {step13['invariants']['violations']} row(s)")
    for s in scenarios:
        if s.get("status") == "failed":
            out.append(f"{s['label']}: FAILED: {s.get('error')}")
        inv = s.get("invariants") or {}
        if inv.get("violations"):
            out.append(
                f"{s['label']}: awp.check_invariants() returned {inv['violations']} row(s) {inv['by_invariant']}"
            )
    return out
