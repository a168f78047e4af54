"""Processes of a benchmark: one ``awp serve``, a pool of ``awp worker`` processes, and what they cost.

Every child is started in its own process group with ``PR_SET_PDEATHSIG`` (SIGKILL), so it dies with the
harness even when the harness itself is killed; :class:`Reaper` remembers every child and kills what is
left on exit (try/finally, also on Ctrl-C and SIGTERM).

Costs are read from ``/proc`` through psutil: CPU seconds (utime + stime) of the gateway, of the workers
and of every process of the PostgreSQL cluster (plus the postmaster's reaped children, so short-lived
backends count too), and peak RSS (``VmHWM``).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
from prometheus_client.parser import text_string_to_metric_families

from awp.dev import procs as awp_procs
from awp.dev.localdb import free_port
from awp.dev.procs import awp_command


class Reaper:
    """Every child process the harness started; :meth:`kill_all` SIGKILLs the survivors' groups."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []

    def spawn(self, cmd: list[str], env: dict[str, str], log_path: Path) -> subprocess.Popen[bytes]:
        # its own session: Ctrl-C reaches the harness only, which stops the children in order
        proc = awp_procs.spawn(cmd, env=env, log_path=log_path, new_session=True, die_with_parent=True)
        self.procs.append(proc)
        return proc

    def kill_all(self) -> None:
        for proc in self.procs:
            with contextlib.suppress(Exception):
                awp_procs.kill(proc)
        self.procs.clear()


# ---- costs ----------------------------------------------------------------------------------------------


def cpu_seconds(pids: list[int], include_reaped_children: bool = False) -> float:
    """utime + stime of these processes and their live descendants; with ``include_reaped_children`` also
    the CPU of the roots' children that already exited (e.g. PostgreSQL backends of closed connections)."""
    total = 0.0
    seen: set[int] = set()
    for pid in pids:
        try:
            root = psutil.Process(pid)
            tree = [root, *root.children(recursive=True)]
            if include_reaped_children:
                t = root.cpu_times()
                total += t.children_user + t.children_system
        except psutil.NoSuchProcess:
            continue
        for p in tree:
            if p.pid in seen:
                continue
            seen.add(p.pid)
            with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                t = p.cpu_times()
                total += t.user + t.system
    return total


def peak_rss_mb(pid: int) -> float:
    """VmHWM (the peak resident set) of one process, in MiB (0 when it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def postmaster_pid(datadir: Path) -> int:
    return int((datadir / "postmaster.pid").read_text().split()[0])


# ---- the gateway ----------------------------------------------------------------------------------------

# ``awp serve`` has no log-level option: it logs at INFO (one access line per request) unless ``awp -v``. For the
# logging scenario of issue 46 the gateway is started through this wrapper, which sets the ``awp`` logger's level
# (argv[1]) before the command runs, as a ``--log-level`` option would: ``logging.basicConfig`` in the command sets
# the root logger only, so every ``awp.*`` logger (the access log ``awp.server.gateway.access`` included) follows
# ``awp``.
_SERVE_AT_LEVEL = (
    "import logging, sys; logging.getLogger('awp').setLevel(sys.argv.pop(1).upper()); "
    "from awp.cli.main import main; main(prog_name='awp')"
)


@dataclass
class Gateway:
    """One ``awp serve`` (gateway + coordinator) on a free port, its log being the access log we parse."""

    reaper: Reaper
    dsn: str
    workdir: Path
    coordinator_interval_ms: int = 1000
    log_level: str | None = None  # None: as `awp serve` (INFO); else its `awp` loggers at this level (_SERVE_AT_LEVEL)
    tokens: dict[str, str] = field(
        default_factory=lambda: {r: f"{r}-{secrets.token_urlsafe(32)}" for r in ("viewer", "operator", "bootstrap")}
    )
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    extra_args: tuple[str, ...] = ()  # more `awp serve` options (step 13: --shard-url per shard)

    @property
    def log_path(self) -> Path:
        return self.workdir / "serve.log"

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> None:
        self.port = free_port()
        env = {
            **os.environ,
            "AWP_DATABASE_URL": self.dsn,
            "AWP_VIEWER_TOKEN": self.tokens["viewer"],
            "AWP_OPERATOR_TOKEN": self.tokens["operator"],
            "AWP_WORKER_BOOTSTRAP_TOKEN": self.tokens["bootstrap"],
            "AWP_COORDINATOR_INTERVAL_MS": str(self.coordinator_interval_ms),
            "PYTHONUNBUFFERED": "1",
        }
        args = ("serve", "--host", "127.0.0.1", "--port", str(self.port), *self.extra_args)
        cmd = (
            awp_command(*args)
            if self.log_level is None
            else [sys.executable, "-c", _SERVE_AT_LEVEL, self.log_level, *args]
        )
        self.proc = self.reaper.spawn(cmd, env, self.log_path)
        awp_procs.wait_ready(self.proc, self._ready, timeout=timeout, what="awp serve", log_path=self.log_path)

    def _ready(self) -> bool:
        """/health/ready answers 200 and this replica's coordinator is active."""
        with (
            contextlib.suppress(OSError, ValueError),  # URLError and HTTPError (503) are OSErrors
            urllib.request.urlopen(self.base_url + "/health/ready", timeout=2) as r,
        ):
            return r.status == 200 and bool(json.loads(r.read()).get("coordinator_active", True))
        return False

    @property
    def pid(self) -> int:
        assert self.proc is not None, "the gateway was not started"
        return self.proc.pid

    def stop(self) -> None:
        if self.proc is not None:
            awp_procs.stop(self.proc, timeout=15)

    def log_tail(self, lines: int = 30) -> str:
        return awp_procs.log_tail(self.log_path, lines)

    def log_offset(self) -> int:
        return self.log_path.stat().st_size

    def access_durations(self, start: int, end: int | None = None) -> dict[str, list[float]]:
        """Request durations (ms) by route, from the access log lines between two offsets."""
        with open(self.log_path, "rb") as f:
            f.seek(start)
            data = f.read() if end is None else f.read(end - start)
        out: dict[str, list[float]] = {}
        for raw in data.decode(errors="replace").splitlines():
            if "awp.gateway.access" not in raw:
                continue
            fields = dict(part.split("=", 1) for part in raw.split() if "=" in part)
            route, ms = fields.get("route"), fields.get("duration_ms")
            if route and ms:
                out.setdefault(route, []).append(float(ms))
        return out

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """The /metrics samples as {(name, sorted labels): value}."""
        with urllib.request.urlopen(self.base_url + "/metrics", timeout=10) as r:
            text = r.read().decode()
        samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
        return samples


def claims_by_result(before: dict[Any, float], after: dict[Any, float]) -> dict[str, float]:
    """Claim requests answered between two scrapes, by result (``empty`` / ``leased``)."""
    out = {}
    for result in ("empty", "leased"):
        key = ("awp_claims_total", (("result", result),))
        out[result] = after.get(key, 0.0) - before.get(key, 0.0)
    return out


def coordinator_work(before: dict[Any, float], after: dict[Any, float]) -> dict[str, float]:
    """Coordinator passes and the dispatches they created between two scrapes (the rest were created
    inline, by start_run or complete_task)."""
    keys = {
        "passes": ("awp_coordinator_passes_total", ()),
        "dispatched": ("awp_coordinator_items_total", (("kind", "dispatched"),)),
    }
    return {name: after.get(key, 0.0) - before.get(key, 0.0) for name, key in keys.items()}


# ---- workers --------------------------------------------------------------------------------------------


@dataclass
class WorkerProc:
    name: str
    concurrency: int
    proc: subprocess.Popen[bytes]
    log_level: str = "warning"

    @property
    def pid(self) -> int:
        return self.proc.pid


class WorkerPool:
    """Real ``awp worker`` processes named ``bench-w<N>``; :meth:`resize` keeps exactly n alive."""

    def __init__(self, reaper: Reaper, gateway: Gateway, workdir: Path, conn: Any) -> None:
        self.reaper = reaper
        self.gateway = gateway
        self.workdir = workdir
        self.conn = conn  # a psycopg connection (autocommit) to see registrations
        self.workers: list[WorkerProc] = []
        self.peak_rss_mb = 0.0  # of workers already stopped
        self._next = 0
        # info logs two lines per task: a benchmark of the product, not of its logging (but for issue 46's logging
        # scenario, which sets "info", `awp worker`'s default, and restarts the pool)
        self.log_level = "warning"

    def _spawn(self, concurrency: int, wait_ms: int) -> WorkerProc:
        self._next += 1
        name = f"bench-w{self._next}"
        env = {**os.environ, "AWP_WORKER_BOOTSTRAP_TOKEN": self.gateway.tokens["bootstrap"], "PYTHONUNBUFFERED": "1"}
        cmd = awp_command(
            "worker",
            "--gateway",
            self.gateway.base_url,
            "--concurrency",
            str(concurrency),
            "--name",
            name,
            "--wait-ms",
            str(wait_ms),
            "--shutdown-timeout",
            "5",
            "--log-level",
            self.log_level,
        )
        return WorkerProc(name, concurrency, self.reaper.spawn(cmd, env, self.workdir / f"{name}.log"), self.log_level)

    def resize(self, n: int, concurrency: int = 1, wait_ms: int = 20000, timeout: float = 60.0) -> None:
        """Exactly ``n`` registered, active workers of this concurrency and of the pool's log level (others drained
        and stopped)."""
        keep = [
            w
            for w in self.workers
            if w.concurrency == concurrency and w.log_level == self.log_level and w.proc.poll() is None
        ][:n]
        self.stop_workers([w for w in self.workers if w not in keep])
        self.workers = keep + [self._spawn(concurrency, wait_ms) for _ in range(n - len(keep))]
        self.wait_registered(timeout)

    def stop_workers(self, workers: list[WorkerProc]) -> None:
        for w in workers:
            self.peak_rss_mb = max(self.peak_rss_mb, peak_rss_mb(w.pid))
            if w.proc.poll() is None:
                w.proc.send_signal(signal.SIGTERM)
        for w in workers:
            awp_procs.stop(w.proc, timeout=10, signalled=True)  # a second SIGTERM would mean "exit at once"
        self.workers = [w for w in self.workers if w not in workers]

    def wait_registered(self, timeout: float) -> None:
        names = [w.name for w in self.workers]
        deadline = time.monotonic() + timeout
        while True:
            for w in self.workers:
                if w.proc.poll() is not None:
                    log = (self.workdir / f"{w.name}.log").read_text(errors="replace")[-2000:]
                    raise RuntimeError(f"worker {w.name} exited with {w.proc.returncode}:\n{log}")
            row = self.conn.execute(
                "SELECT count(*) FROM awp.workers WHERE display_name = ANY(%s) AND status = 'active'", [names]
            ).fetchone()
            if row[0] == len(names):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {row[0]} of {len(names)} workers registered after {timeout}s")
            time.sleep(0.05)

    def by_worker_id(self, worker_id: str) -> WorkerProc | None:
        row = self.conn.execute("SELECT display_name FROM awp.workers WHERE worker_id = %s", [worker_id]).fetchone()
        return next((w for w in self.workers if row and w.name == row[0]), None)

    def kill9(self, w: WorkerProc) -> None:
        self.peak_rss_mb = max(self.peak_rss_mb, peak_rss_mb(w.pid))
        awp_procs.kill(w.proc)
        self.workers.remove(w)

    def pids(self) -> list[int]:
        return [w.pid for w in self.workers]

    def current_peak_rss_mb(self) -> float:
        return max([self.peak_rss_mb, *(peak_rss_mb(p) for p in self.pids())])
