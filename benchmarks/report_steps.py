"""The tables of the benchmark's later steps (``report.py``): the I/O-bound run (step 6b, issue 18), many runs
(step 9, issue 46, ``many_runs.py``), dynamic workflows (step 10, issue 39) and rate limits (step 11, issue 40)."""

from __future__ import annotations

from typing import Any

from report_format import Table, _f, _ms, _pcts, _spread
from report_targets import _base_shape, _by_label_prefix, _measured

# ---- issue 18: I/O-bound ----------------------------------------------------------------------------------


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


# ---- issue 46: many runs (benchmarks/many_runs.py) --------------------------------------------------------


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


# ---- issue 39: dynamic workflows (benchmarks/dynamic.py) --------------------------------------------------


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


# ---- issue 40: rate limits (benchmarks/pacing.py) ---------------------------------------------------------


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


def sharded_table(results: dict[str, Any]) -> Table:
    """Step 13 (issue 43, benchmarks/sharded.py): through a PL/Proxy router over two shards against one database."""
    r = results.get("sharded") or {}
    t = Table(
        "Sharded (issue 43): a PL/Proxy router over 2 shard clusters vs one database, same machine, 4 workers x 1",
        ["scenario", "router tasks/s", "one database tasks/s", "ratio"],
    )
    if r.get("status") == "failed":
        t.add("FAILED", "-", "-", "-")
        t.notes.append(str(r.get("error")))
        return t
    for s in r.get("scenarios", []):
        t.add(s["label"], _f(s["router"]), _f(s["one"]), f"{s['ratio']:.2f}" if s["ratio"] else "-")
    c = r.get("per_call_us") or {}
    if c:
        t.notes.append(
            f"One awp.run_revision call, one client: {c['router']:.0f} us through the router, {c['shard']:.0f} us on "
            f"the shard directly. Runs per shard: {r.get('runs_per_shard')}. No target: on one machine the router "
            "cannot be faster (docs/performance.md, Sharding)."
        )
    return t
