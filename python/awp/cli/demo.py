"""``awp demo``: the whole platform on one machine, with a crash in the middle.

From nothing: start the local database (``.awp/``) or use ``--database-url``, migrate, start ``awp serve`` and
three ``awp worker`` processes (real subprocesses, random tokens passed by environment), apply
``examples/demo-etl.yaml``, start a run and watch it; when the fan-out is running, ``kill -9`` a worker that
holds a lease and show its task(s) taken over as attempt 2 by another worker; print the summary; then stop
the workers (SIGTERM: they drain) and the gateway. Ctrl-C at any point shuts everything down the same way.

Timings are shortened for the demo (``awp.configure``: lease 3 s, heartbeat 0.5 s) and restored at the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import yaml
from psycopg.conninfo import conninfo_to_dict
from rich.console import Console

from awp.dev import procs
from awp.worker.client import Client, ClientError, wait_ready


class DemoError(Exception):
    """The demo could not set itself up (database, gateway or workers did not start)."""


@dataclass
class Timings:
    lease_ms: int
    heartbeat_ms: int
    safety_margin_ms: int
    coordinator_interval_s: float
    sleep_scale: float


# NORMAL applies examples/demo-etl.yaml unchanged (so applying that file after the demo keeps its version);
# FAST (tests) scales the sleeps and applies the result under its own id, demo-etl-fast.
NORMAL = Timings(lease_ms=3000, heartbeat_ms=500, safety_margin_ms=600, coordinator_interval_s=0.25, sleep_scale=1.0)
# The run's input: every lease carries it as run_input (summarize reads it as ctx.run_input).
DEMO_INPUT = {"batch": "demo-1", "source": "examples/demo-etl.yaml"}
FAST = Timings(lease_ms=2000, heartbeat_ms=200, safety_margin_ms=400, coordinator_interval_s=0.1, sleep_scale=0.3)


def examples_dir() -> Path:
    """``examples/`` of the source tree (the package is installed in editable mode), else of the cwd."""
    here = Path(__file__).resolve().parents[3] / "examples"
    return here if here.is_dir() else Path.cwd() / "examples"


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    worker_id: str | None = None

    @property
    def alive(self) -> bool:
        return self.popen.poll() is None


@dataclass
class Takeover:
    task_key: str
    old_worker: str
    killed_at: float
    new_worker: str | None = None
    new_attempt: int | None = None
    seconds: float | None = None
    old_status: str | None = None


@dataclass
class DemoState:
    procs: list[Proc] = field(default_factory=list)
    victim: Proc | None = None
    takeovers: list[Takeover] = field(default_factory=list)
    gateway: str | None = None
    operator_token: str | None = None
    run_id: str | None = None
    finished: bool = False


def _spawn(name: str, args: list[str], env: dict[str, str], log_dir: Path) -> Proc:
    log_path = log_dir / f"{name}.log"
    # its own session: Ctrl-C reaches the demo only; it stops the children in order
    return Proc(name, procs.start(args, env=env, log_path=log_path, new_session=True), log_path)


def _stop(proc: Proc, timeout_s: float, signalled: bool = False) -> int | None:
    """SIGTERM (unless ``signalled``: a second one would mean "exit at once"), wait, then SIGKILL."""
    return procs.stop(proc.popen, timeout_s, signalled=signalled)


def _local_database(console: Console) -> tuple[str, str, Any]:
    """Start (create the first time) the local cluster, its 'awp' database and the gateway's login, like
    ``awp db up`` (the caller migrates); returns the superuser's DSN, the gateway login's DSN and the
    cluster when the demo started it."""
    from awp.dev.localdb import ClusterError, find_project_dir, project_cluster, up_project_database
    from awp.dev.pgbin import PostgresNotFound

    try:
        project_dir = find_project_dir()
        if not project_cluster(project_dir).status().initialized:
            console.print("creating the local PostgreSQL cluster under .awp/ …")
        local = up_project_database(project_dir, run_migrate=False)
    except (ClusterError, PostgresNotFound, OSError, psycopg.Error) as e:
        raise DemoError(f"cannot start the local database: {e}") from e
    return local.admin_dsn, local.gateway_dsn, (local.cluster if local.started else None)


def _prepare_definition(timings: Timings, name: str = "demo-etl.yaml") -> dict[str, Any]:
    definition = yaml.safe_load((examples_dir() / name).read_text())
    if timings.sleep_scale != 1.0:
        definition["id"] = f"{definition['id']}-fast"
        for task in definition["tasks"]:
            inp = task.get("input") or {}
            if isinstance(inp.get("sleep_ms"), int):
                inp["sleep_ms"] = max(50, int(inp["sleep_ms"] * timings.sleep_scale))
            if task.get("executor") == "workflow":  # its child workflow is applied under its -fast id too
                inp["workflow_id"] = f"{inp['workflow_id']}-fast"
    return definition


# The dynamic example's document (`awp demo --dynamic`): cut into chunks at run time by examples/handlers.py:chunk.
DYNAMIC_DOCUMENT = (
    "A control plane keeps every fact in PostgreSQL. Workers pull tasks over HTTP, hold leases with secret tokens, "
    "renew them with heartbeats and report results. The database decides with its own clock who owns each "
    "attempt, so a stale worker's late result is rejected and a crashed worker's task is retried. Agent workloads "
    "are many small dynamic runs: an agent decides at run time how many things to do, so a workflow maps a task "
    "over a list that an earlier task produced, takes one branch or another on a condition, and starts whole "
    "workflows as child runs. Each instance of a mapped task is an ordinary task: it is leased, fenced, retried "
    "and counted against the run's concurrency like any other, and the mapped task's output is the list of its "
    "instances' outputs in order. A condition that does not hold skips its task without failing the run, and a "
    "child run's output becomes the output of the task that started it."
)


def run_demo(
    database_url: str | None = None, fast: bool = False, port: int = 0, n_workers: int = 3, dynamic: bool = False
) -> int:
    """Run the demo; returns the exit code (0 when the run succeeded after a takeover). ``dynamic``: the dynamic
    example instead (examples/demo-dynamic.yaml: for_each, when, a child run; docs/dynamic.md), without a kill."""
    console = Console()
    timings = FAST if fast else NORMAL
    state = DemoState()
    own_cluster = None
    old_settings: dict[str, Any] | None = None
    dsn = serve_dsn = database_url
    log_dir = Path(tempfile.mkdtemp(prefix="awp-demo-"))
    previous_term = signal.getsignal(signal.SIGTERM)

    def on_term(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    started = time.monotonic()
    try:
        from awp.dev.migrate import MigrationError, migrate

        console.rule("[bold]AWP demo")
        if dsn is None:  # the superuser migrates; awp serve logs in as the execute-only awp_gateway_login
            dsn, serve_dsn, own_cluster = _local_database(console)
        try:
            applied = migrate(dsn)
        except (MigrationError, FileNotFoundError, psycopg.Error) as e:
            raise DemoError(f"migration failed: {e}") from e
        console.print(f"database ready; migrations applied: {', '.join(applied) or 'none (up to date)'}")
        with psycopg.connect(dsn, autocommit=True) as conn:
            row = conn.execute("SELECT awp.get_settings()").fetchone()
            old_settings = row[0] if row else None
            conn.execute(
                "SELECT awp.configure(lease_duration_ms => %s, heartbeat_interval_ms => %s)",
                (timings.lease_ms, timings.heartbeat_ms),
            )
        console.print(f"demo timings: lease {timings.lease_ms} ms, heartbeat {timings.heartbeat_ms} ms")
        assert serve_dsn is not None
        return asyncio.run(_main(console, serve_dsn, port, n_workers, timings, state, log_dir, dynamic))
    except KeyboardInterrupt:
        console.print("[yellow]interrupted: shutting down[/]")
        return 130
    except (TimeoutError, ClientError) as e:
        console.print(f"[red]demo failed: {e}[/]")
        return 1
    finally:
        with contextlib.suppress(KeyboardInterrupt):
            _shutdown(console, state, dsn, old_settings, own_cluster)
        signal.signal(signal.SIGTERM, previous_term)
        console.print(f"demo finished in {time.monotonic() - started:.1f}s (process logs in {log_dir})")


def _shutdown(
    console: Console, state: DemoState, dsn: str | None, old_settings: dict[str, Any] | None, cluster: Any
) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # finish cleaning up even on a second Ctrl-C
    try:
        if state.run_id and not state.finished and state.gateway:
            console.print(f"cancelling run {state.run_id} (the demo did not see it end) …")
            with contextlib.suppress(ClientError, OSError, TimeoutError):
                asyncio.run(_cancel(state.gateway, state.operator_token, state.run_id))
        workers = [p for p in state.procs if p.name.startswith("worker") and p.alive]
        servers = [p for p in state.procs if not p.name.startswith("worker")]
        if workers:
            console.print(f"stopping {len(workers)} worker(s) with SIGTERM (they drain) …")
        for p in workers:
            with contextlib.suppress(ProcessLookupError):
                p.popen.send_signal(signal.SIGTERM)
        for p in workers:
            code = _stop(p, 15, signalled=True)
            console.print(f"  {p.name} exited with {code}")
        for p in servers:
            if p.alive:
                console.print(f"stopping {p.name} …")
            code = _stop(p, 15)
            console.print(f"  {p.name} exited with {code}")
        if dsn and old_settings:
            with contextlib.suppress(psycopg.Error), psycopg.connect(dsn, autocommit=True, connect_timeout=5) as conn:
                conn.execute(
                    "SELECT awp.configure(lease_duration_ms => %s, heartbeat_interval_ms => %s)",
                    (old_settings["lease_duration_ms"], old_settings["heartbeat_interval_ms"]),
                )
        if cluster is not None:
            console.print("stopping the local database (it was started by the demo) …")
            with contextlib.suppress(Exception):
                cluster.stop()
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)


async def _cancel(gateway: str, token: str | None, run_id: str) -> None:
    async with Client(gateway, token, timeout_s=5) as client:
        await client.cancel_run(run_id)


async def _main(
    console: Console,
    dsn: str,
    port: int,
    n_workers: int,
    timings: Timings,
    state: DemoState,
    log_dir: Path,
    dynamic: bool = False,
) -> int:
    from awp.cli.terminal import watch_run, workers_table
    from awp.dev.localdb import free_port

    port = port or free_port()
    gateway = f"http://127.0.0.1:{port}"
    viewer, operator, bootstrap = (secrets.token_urlsafe(32) for _ in range(3))
    base_env = {k: v for k, v in os.environ.items() if not k.startswith("AWP_")}
    serve_env = {
        **base_env,
        "AWP_DATABASE_URL": dsn,
        "AWP_VIEWER_TOKEN": viewer,
        "AWP_OPERATOR_TOKEN": operator,
        "AWP_WORKER_BOOTSTRAP_TOKEN": bootstrap,
        "AWP_COORDINATOR_INTERVAL_MS": str(int(timings.coordinator_interval_s * 1000)),
    }
    state.gateway, state.operator_token = gateway, operator
    server = _spawn("gateway", ["serve", "--host", "127.0.0.1", "--port", str(port)], serve_env, log_dir)
    state.procs.append(server)
    try:
        await wait_ready(gateway, timeout_s=30)
    except TimeoutError as e:
        raise DemoError(f"the gateway did not start: see {server.log_path}\n{_tail(server.log_path)}") from e
    login = conninfo_to_dict(dsn).get("user") or "the default user"
    console.print(f"gateway up at {gateway} (pid {server.popen.pid}), database login {login}")

    handlers = str(examples_dir() / "handlers.py")
    for i in range(1, n_workers + 1):
        worker_env = {**base_env, "AWP_GATEWAY_URL": gateway, "AWP_WORKER_BOOTSTRAP_TOKEN": bootstrap}
        args = [
            "worker",
            "--name",
            f"demo-worker-{i}",
            "--executor",
            "mock,python",
            "--handlers",
            handlers,
            "--concurrency",
            "4",
            "--safety-margin-ms",
            str(timings.safety_margin_ms),
            "--wait-ms",
            "5000",
            "--shutdown-timeout",
            "10",
        ]
        state.procs.append(_spawn(f"worker-{i}", args, worker_env, log_dir))

    async with Client(gateway, operator) as client:
        await _wait_workers(client, state, n_workers)
        console.print(workers_table(await _our_workers(client, state)))
        if dynamic:
            return await _run_dynamic(console, client, state, timings)
        definition = _prepare_definition(timings)
        applied = await client.apply_workflow(definition)
        console.print(
            f"workflow [bold]{applied['workflow_id']}[/] version {applied['version']}: "
            f"{len(definition['tasks'])} tasks (fan-out, fan-in, a flaky task, a python handler)"
        )
        run = await client.start_run(applied["workflow_id"], applied["version"], input=DEMO_INPUT)
        run_id = state.run_id = run["run_id"]
        console.print(f"run [bold]{run_id}[/] started; a worker will be killed with SIGKILL while it holds a lease")

        async def on_tick(info: dict[str, Any], tasks: list[dict[str, Any]]) -> None:
            await _chaos(console, client, state, run_id, tasks)

        final = await watch_run(client, run_id, console, on_tick=on_tick, timeout_s=180, poll_s=0.25)
        state.finished = True
        # Takeovers not yet seen by a tick (the run ended first): resolve them now.
        await _resolve_takeovers(console, client, state, run_id)

        console.rule("[bold]takeover")
        if state.takeovers:
            for t in state.takeovers:
                console.print(
                    f"task [bold]{t.task_key}[/]: attempt 1 on {t.old_worker} ({t.old_status or 'interrupted'}) → "
                    f"attempt {t.new_attempt} on {t.new_worker}, {t.seconds:.1f}s after the kill"
                    if t.new_worker
                    else f"task {t.task_key}: no second attempt seen"
                )
        else:
            console.print("[yellow]no worker was killed (the run ended before a lease could be caught)[/]")
        flaky = await client.get_task(run_id, "transform-05")
        history = ", ".join(f"#{a.get('attempt')} {a.get('status')}" for a in flaky.get("attempt_history") or [])
        console.print(
            f"flaky task transform-05: {flaky.get('status')} after {flaky.get('attempts')} attempts ({history})"
        )
        await _show_data_flow(console, client, run_id)
        console.print(workers_table(await _our_workers(client, state)))
        ok = final == "succeeded" and all(t.new_worker for t in state.takeovers) and bool(state.takeovers)
        console.print(f"[bold {'green' if ok else 'red'}]run {run_id} {final}[/]")
        return 0 if ok else 1


async def _run_dynamic(console: Console, client: Client, state: DemoState, timings: Timings) -> int:
    """The dynamic example (docs/dynamic.md): chunk -> summarize each chunk (for_each) -> merge -> a review child
    run or a short note (when); watched to the end, then what each dynamic step did."""
    from awp.cli.terminal import watch_run

    review = await client.apply_workflow(_prepare_definition(timings, "demo-review.yaml"))
    definition = _prepare_definition(timings, "demo-dynamic.yaml")
    applied = await client.apply_workflow(definition)
    console.print(
        f"workflows [bold]{applied['workflow_id']}[/] v{applied['version']} and [bold]{review['workflow_id']}[/] "
        f"v{review['version']} (its child run)"
    )
    run = await client.start_run(applied["workflow_id"], applied["version"], input={"document": DYNAMIC_DOCUMENT})
    run_id = state.run_id = run["run_id"]
    console.print(f"run [bold]{run_id}[/] started on a document of {len(DYNAMIC_DOCUMENT.split())} words")
    final = await watch_run(client, run_id, console, timeout_s=180, poll_s=0.25)
    state.finished = True

    console.rule("[bold]dynamic steps")
    tasks = await client.run_tasks(run_id)
    instances = [t for t in tasks if t.get("mapped_task") == "summarize"]
    mapped = await client.get_task(run_id, "summarize")
    console.print(
        f"chunk cut the document into {mapped.get('item_count')} chunks; summarize ran as {len(instances)} "
        f"instances summarize[0]..summarize[{len(instances) - 1}] (ctx.item, ctx.item_index), "
        f"{mapped.get('instances_succeeded')} succeeded"
    )
    merge = ((await client.get_task(run_id, "merge")).get("attempt_history") or [{}])[-1].get("output") or {}
    console.print(
        f"merge read the {merge.get('chunks')} summaries in order: {merge.get('words')} words, long={merge.get('long')}"
    )
    short = await client.get_task(run_id, "short-note")
    console.print(f"short-note: {short.get('status')} ({short.get('skip_reason')})")
    sub = await client.get_task(run_id, "review")
    child = await client.get_run(str(sub.get("child_run_id"))) if sub.get("child_run_id") else {}
    console.print(
        f"review: child run {child.get('run_id')} of {child.get('workflow_id')} {child.get('status')}; "
        f"its output became review's: {json.dumps(sub.get('output'))}"
    )
    ok = (
        final == "succeeded"
        and short.get("skip_reason") == "condition_false"
        and child.get("status") == "succeeded"
        and len(instances) == mapped.get("item_count")
    )
    console.print(f"[bold {'green' if ok else 'red'}]run {run_id} {final}[/]")
    return 0 if ok else 1


async def _show_data_flow(console: Console, client: Client, run_id: str) -> None:
    """What the fan-in tasks received: the run's input and their dependencies' outputs; then the run's output."""
    console.rule("[bold]data flow")
    validate = (await client.get_task(run_id, "validate-a")).get("attempt_history") or [{}]
    echoed = validate[-1].get("output") or {}
    upstream = echoed.get("upstream") or {}
    console.print(
        f"validate-a (mock, echo) received run_input {json.dumps(echoed.get('run_input'))} and the outputs of "
        f"{', '.join(sorted(upstream)) or 'nothing'}, e.g. {json.dumps(next(iter(upstream.values()), None))}"
    )
    summary = ((await client.get_task(run_id, "summarize")).get("attempt_history") or [{}])[-1].get("output") or {}
    console.print(
        f"summarize (python) read ctx.run_input batch={summary.get('batch')!r} and "
        f"ctx.upstream from {', '.join(summary.get('inputs_from') or []) or 'nothing'}"
    )
    run = await client.get_run(run_id)
    console.print(f"run output (the tasks no other task depends on): {json.dumps(run.get('output'))}")


async def _our_workers(client: Client, state: DemoState) -> list[dict[str, Any]]:
    ids = {p.worker_id for p in state.procs if p.worker_id}
    return [w for w in await client.list_workers() if w.get("worker_id") in ids]


def _tail(path: Path, lines: int = 20) -> str:
    return procs.log_tail(path, lines)


async def _wait_workers(client: Client, state: DemoState, n: int) -> None:
    deadline = time.monotonic() + 30
    names = {p.name.replace("worker-", "demo-worker-"): p for p in state.procs if p.name.startswith("worker")}
    while True:
        for p in names.values():
            if not p.alive:
                raise DemoError(f"{p.name} exited with {p.popen.returncode}: {_tail(p.log_path)}")
        items = await client.list_workers()
        for w in items:
            proc = names.get(str(w.get("display_name")))
            if proc is not None and w.get("status") == "active":
                proc.worker_id = str(w["worker_id"])
        if all(p.worker_id for p in names.values()):
            return
        if time.monotonic() > deadline:
            raise DemoError("the workers did not register in 30s")
        await asyncio.sleep(0.2)


async def _chaos(console: Console, client: Client, state: DemoState, run_id: str, tasks: list[dict[str, Any]]) -> None:
    """During the fan-out, SIGKILL the worker holding the most long (extract) tasks; then follow the takeover."""
    if state.victim is not None:
        await _resolve_takeovers(console, client, state, run_id)
        return
    running = [str(t["task_key"]) for t in tasks if t.get("status") == "running"]
    if sum(key.startswith("extract") for key in running) < 2:
        return
    ours = {p.worker_id: p for p in state.procs if p.worker_id and p.alive}
    held: dict[str, list[str]] = {}
    for key in running:
        history = (await client.get_task(run_id, key)).get("attempt_history") or []
        last = history[-1] if history else None
        if last and last.get("status") == "running" and last.get("worker_id") in ours:
            held.setdefault(str(last["worker_id"]), []).append(key)
    if not held:
        return
    busy = {str(w["worker_id"]) for w in await client.list_workers() if w.get("active_leases")}
    candidates = [wid for wid in held if wid in busy]  # GET /workers confirms it holds leases right now
    if not candidates:
        return
    victim_id = max(candidates, key=lambda wid: (sum(k.startswith("extract") for k in held[wid]), len(held[wid])))
    victim = ours[victim_id]
    victim.popen.kill()
    victim.popen.wait(5)
    killed_at = time.monotonic()
    state.victim = victim
    name = f"{victim.name} ({victim.worker_id})"
    state.takeovers = [Takeover(key, name, killed_at) for key in held[victim_id]]
    console.print(
        f"[bold red]kill -9[/] {name}, pid {victim.popen.pid}, while it holds {', '.join(held[victim_id])}; "
        "nobody renews those leases now: the coordinator reaps them and another worker takes over"
    )


async def _resolve_takeovers(console: Console, client: Client, state: DemoState, run_id: str) -> None:
    names = {p.worker_id: p.name for p in state.procs if p.worker_id}
    for t in list(state.takeovers):
        if t.new_worker:
            continue
        try:
            history = (await client.get_task(run_id, t.task_key)).get("attempt_history") or []
        except ClientError:
            continue
        first = next((a for a in history if a.get("attempt") == 1), None)
        if first and first.get("status") == "succeeded":
            state.takeovers.remove(t)  # it finished in the instant before the kill: nothing to take over
            continue
        if first and first.get("status") != "running":
            t.old_status = str(first.get("status"))
        later = [a for a in history if int(a.get("attempt", 0)) >= 2]
        if later:
            a = later[0]
            t.new_attempt = int(a["attempt"])
            t.new_worker = f"{names.get(a.get('worker_id'), '?')} ({a.get('worker_id')})"
            t.seconds = time.monotonic() - t.killed_at
            console.print(
                f"[bold green]takeover[/]: {t.task_key} attempt 1 on {t.old_worker} was "
                f"{t.old_status or 'interrupted'}; attempt {t.new_attempt} runs on {t.new_worker}, "
                f"{t.seconds:.1f}s after the kill"
            )
