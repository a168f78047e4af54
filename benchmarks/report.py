"""The benchmark's outputs: a plain-text table (printed), the same in Markdown (``latest.md``, for the
README), the JSON (``bench-<timestamp>.json`` and ``latest.json``) and a chart (``latest.png``).
The blocks (Table, formats) are in ``report_format.py``, the targets in ``report_targets.py``, the tables of
the later steps in ``report_steps.py``, the chart in ``report_chart.py``."""

from __future__ import annotations

import datetime as dt
import json
import shutil
from pathlib import Path
from typing import Any

from report_chart import chart
from report_format import PUBLISHED, PUBLISHED_NOTE, REF_LIMIT, REF_PEER, Table, _busy, _f, _ms, _pcts, _spread
from report_steps import dynamic_table, io_table, many_runs_tables, pacing_table, sharded_table
from report_targets import _by_label_prefix, _peer_missing, _peer_rate, _scenarios, many_runs_targets, targets


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
    if results.get("sharded"):
        out.append(sharded_table(results))
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
