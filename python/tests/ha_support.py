"""A throwaway PostgreSQL high-availability cluster for tests (issue 16): one etcd member and two PostgreSQL
nodes managed by Patroni, with synchronous replication, everything on 127.0.0.1 with free ports and data
under one temporary directory.

    with patroni_cluster() as ha:                  # started; a leader and a synchronous standby exist
        dsn = ha.dsn("awp")                        # multi-host, target_session_attrs=read-write
        old = ha.leader()
        ha.kill_postmaster(old)                    # kill -9 of the primary's postmaster
        new = ha.wait_leader(other_than=old)       # Patroni promoted the standby
        ha.wait_whole()                            # the old primary is back as synchronous standby
        ha.switchover(new, old)                    # planned switchover through the REST API

- The settings follow what was measured on this kind of machine (/work/shared/notes): ``ttl`` 10,
  ``loop_wait`` 1, ``retry_timeout`` 4, ``synchronous_mode`` and ``synchronous_mode_strict`` (a commit
  acknowledged to a client is on the standby too, even right after a failover), ``primary_start_timeout`` 0
  (a crashed primary fails over instead of being restarted in place), ``use_pg_rewind`` with ``wal_log_hints``.
- When we are root, Patroni runs as the ``postgres`` OS user through ``Popen(user=...)`` (no ``runuser``:
  the process we hold is Patroni itself, so its pid is the one to signal); etcd runs as us.
- The cluster state is read from Patroni's REST API (``/primary``, ``/sync``), not ``patronictl`` (slow,
  and 3.0.2 does not show replicas as streaming), plus ``pg_stat_replication`` on the leader.
- Teardown (always, also when the test fails) is by pid: each Patroni (SIGTERM: it stops its PostgreSQL;
  SIGKILL after a grace period), then any postmaster still running (SIGQUIT, then SIGKILL), then etcd.
- :class:`WriteProbe` commits one row at a time through the multi-host DSN in a thread: when writes stop and
  resume, on which node, and whether every acknowledged row survived.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg

from awp.dev.localdb import PG_OS_USER, free_port, give_to_server_user, is_root
from awp.dev.pgbin import bindir
from awp_testing.gateway import wait_until

# Dynamic (DCS) settings: see the module docstring. loop_wait + 2 * retry_timeout <= ttl.
DCS_SETTINGS: dict[str, Any] = {
    "ttl": 10,
    "loop_wait": 1,
    "retry_timeout": 4,
    "maximum_lag_on_failover": 1048576,
    "synchronous_mode": True,
    "synchronous_mode_strict": True,
    "primary_start_timeout": 0,
}
INSTALL_HINT = "run `make ha-deps` (apt-get install -y patroni etcd-server)"


def missing_programs() -> list[str]:
    """The programs this harness needs that are not on PATH."""
    return [p for p in ("patroni", "etcd") if shutil.which(p) is None]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (our own child not reaped yet) counts as dead.
    with contextlib.suppress(OSError):
        if Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].startswith("Z"):
            return False
    return True


def _signal_and_wait(pid: int, first: signal.Signals, grace: float) -> None:
    """Send ``first`` to ``pid``, wait ``grace`` seconds for it to go, then SIGKILL it."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, first)
    deadline = time.monotonic() + grace
    while _pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if _pid_alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _free_ports(n: int) -> list[int]:
    ports: list[int] = []
    while len(ports) < n:
        port = free_port()
        if port not in ports:
            ports.append(port)
    return ports


@dataclass
class Node:
    """One PostgreSQL node and the Patroni that manages it."""

    name: str
    pg_port: int
    rest_port: int
    home: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def data_dir(self) -> Path:
        return self.home / "data"

    @property
    def log_path(self) -> Path:
        return self.home / "patroni.log"

    def dsn(self, dbname: str = "postgres") -> str:
        """This node alone (whatever its role)."""
        return f"postgresql://postgres@127.0.0.1:{self.pg_port}/{dbname}"

    def postmaster_pid(self) -> int | None:
        """The pid of this node's running postmaster, from ``postmaster.pid`` (None when it is not running)."""
        try:
            pid = int((self.data_dir / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None
        try:
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            return None
        return pid if comm in ("postgres", "postmaster") and _pid_alive(pid) else None

    def rest(self, path: str, timeout: float = 1.0) -> int | None:
        """HTTP status of ``GET path`` on this node's Patroni REST API (None when it does not answer)."""
        try:
            return httpx.get(f"http://127.0.0.1:{self.rest_port}{path}", timeout=timeout).status_code
        except httpx.HTTPError:
            return None

    def log_tail(self, lines: int = 30) -> str:
        try:
            tail = self.log_path.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            return ""
        return f"--- last lines of {self.log_path} ---\n" + "\n".join(tail)


@dataclass
class PatroniCluster:
    """etcd + two Patroni nodes under ``base`` (see the module docstring). Use :func:`patroni_cluster`."""

    base: Path
    scope: str = field(default_factory=lambda: f"awp-ha-{os.getpid()}-{time.monotonic_ns() % 100000}")
    fsync: bool = True
    nodes: list[Node] = field(default_factory=list)
    etcd: subprocess.Popen[bytes] | None = None
    etcd_port: int = 0

    # -- start ------------------------------------------------------------------------------------------------

    def start(self, timeout: float = 90.0) -> None:
        etcd_client, etcd_peer, *node_ports = _free_ports(6)
        self.etcd_port = etcd_client
        self._start_etcd(etcd_client, etcd_peer)
        for i in range(2):
            node = Node(f"node{i}", node_ports[2 * i], node_ports[2 * i + 1], self.base / f"node{i}")
            self.nodes.append(node)
        for node in self.nodes:
            self._start_patroni(node)
            if node is self.nodes[0]:  # let the first one bootstrap alone: the second then clones it
                self.wait_leader(timeout)
        self.wait_whole(timeout)

    def _start_etcd(self, client: int, peer: int) -> None:
        data = self.base / "etcd"
        data.mkdir()
        url = "http://127.0.0.1:{}".format
        cmd = [
            shutil.which("etcd") or "etcd", "--name", "etcd0", "--data-dir", str(data),
            "--listen-client-urls", url(client), "--advertise-client-urls", url(client),
            "--listen-peer-urls", url(peer), "--initial-advertise-peer-urls", url(peer),
            "--initial-cluster", f"etcd0={url(peer)}", "--initial-cluster-state", "new",
            "--initial-cluster-token", self.scope,
        ]  # fmt: skip
        with open(self.base / "etcd.log", "wb") as log:
            self.etcd = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, cwd=self.base, start_new_session=True
            )

        def healthy() -> bool:
            if self.etcd is None or self.etcd.poll() is not None:
                raise RuntimeError(f"etcd exited:\n{(self.base / 'etcd.log').read_text(errors='replace')[-3000:]}")
            with contextlib.suppress(httpx.HTTPError, ValueError):
                return httpx.get(f"http://127.0.0.1:{client}/health", timeout=1).json().get("health") == "true"
            return False

        wait_until(healthy, 20, 0.05, "etcd to be healthy")

    def _config(self, node: Node) -> dict[str, Any]:
        parameters = {
            "unix_socket_directories": str(node.home / "run"),
            "max_connections": 200,
            "shared_buffers": "128MB",
            "wal_log_hints": "on",
            "wal_keep_size": "256MB",
            "logging_collector": "off",
            # A standby whose first attempt to stream failed (e.g. its slot on the new primary does not exist
            # yet) retries after this, not the default 5 s: under synchronous_mode_strict writes wait for it.
            "wal_retrieve_retry_interval": "250ms",
            "log_min_messages": "warning",
        }
        if not self.fsync:
            parameters |= {"fsync": "off", "full_page_writes": "off"}
        return {
            "scope": self.scope,
            "namespace": "/awp-ha/",
            "name": node.name,
            "log": {"level": "INFO"},
            "restapi": {"listen": f"127.0.0.1:{node.rest_port}", "connect_address": f"127.0.0.1:{node.rest_port}"},
            "etcd3": {"hosts": [f"127.0.0.1:{self.etcd_port}"]},
            "bootstrap": {
                "dcs": {
                    **DCS_SETTINGS,
                    "postgresql": {
                        "use_pg_rewind": True,
                        "use_slots": True,
                        "parameters": {"wal_log_hints": "on", "max_connections": 200, "hot_standby": "on"},
                    },
                },
                "initdb": [{"encoding": "UTF8"}, "no-locale", {"auth": "trust"}],
            },
            "postgresql": {
                "listen": f"127.0.0.1:{node.pg_port}",
                "connect_address": f"127.0.0.1:{node.pg_port}",
                "data_dir": str(node.data_dir),
                "bin_dir": str(bindir()),
                "pgpass": str(node.home / "pgpass"),
                "authentication": {
                    "superuser": {"username": "postgres", "password": "postgres"},
                    "replication": {"username": "replicator", "password": "replicator"},
                },
                "pg_hba": [
                    "local all all trust",
                    "host all all 127.0.0.1/32 trust",
                    "host replication all 127.0.0.1/32 trust",
                ],
                "parameters": parameters,
            },
        }

    def _start_patroni(self, node: Node) -> None:
        node.home.mkdir()
        (node.home / "run").mkdir()
        config = node.home / "patroni.yml"
        config.write_text(json.dumps(self._config(node), indent=2) + "\n")  # JSON is YAML
        for path in (node.home, node.home / "run", config):
            give_to_server_user(path)
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONUNBUFFERED": "1"}
        as_user: dict[str, Any] = {}
        if is_root():
            as_user = {"user": PG_OS_USER, "group": PG_OS_USER, "extra_groups": []}
            env["HOME"] = str(node.home)
        with open(node.log_path, "wb") as log:
            node.proc = subprocess.Popen(
                [shutil.which("patroni") or "patroni", str(config)],
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=node.home,
                env=env,
                start_new_session=True,
                **as_user,
            )

    # -- state --------------------------------------------------------------------------------------------------

    def dsn(self, dbname: str = "postgres") -> str:
        """Every node, libpq picks the one that accepts writes."""
        hosts = ",".join(f"127.0.0.1:{n.pg_port}" for n in self.nodes)
        return f"postgresql://postgres@{hosts}/{dbname}?target_session_attrs=read-write"

    def other(self, node: Node) -> Node:
        return next(n for n in self.nodes if n is not node)

    def _check_alive(self) -> None:
        for node in self.nodes:
            if node.proc is not None and node.proc.poll() is not None:
                raise RuntimeError(f"patroni {node.name} exited with {node.proc.returncode}\n{node.log_tail()}")
        if self.etcd is not None and self.etcd.poll() is not None:
            raise RuntimeError(f"etcd exited with {self.etcd.returncode}")

    def leader(self) -> Node | None:
        """The node whose Patroni says it is the running primary (None when none or several do)."""
        self._check_alive()
        leaders = [n for n in self.nodes if n.rest("/primary") == 200]
        return leaders[0] if len(leaders) == 1 else None

    def wait_leader(self, timeout: float = 30.0, other_than: Node | None = None) -> Node:
        def found() -> Node | None:
            self._check_alive()
            nodes = [n for n in self.nodes if n is not other_than]
            leaders = [n for n in nodes if n.rest("/primary", timeout=0.5) == 200]
            return leaders[0] if len(leaders) == 1 else None

        what = "a Patroni leader" + (f" other than {other_than.name}" if other_than else "")
        return self._wait(found, timeout, what)

    def sync_standby(self, leader: Node) -> Node | None:
        """The other node when Patroni names it synchronous standby and the leader streams to it in sync."""
        standby = self.other(leader)
        if standby.rest("/sync") != 200:
            return None
        try:
            with psycopg.connect(leader.dsn(), autocommit=True, connect_timeout=2) as c:
                rows = c.execute(
                    "SELECT 1 FROM pg_stat_replication WHERE application_name = %s "
                    "AND state = 'streaming' AND sync_state = 'sync'",
                    (standby.name,),
                ).fetchall()
        except psycopg.Error:
            return None
        return standby if rows else None

    def wait_whole(self, timeout: float = 60.0) -> tuple[Node, Node]:
        """Wait for one leader and the other node streaming to it as synchronous standby."""

        def whole() -> tuple[Node, Node] | None:
            leader = self.leader()
            standby = self.sync_standby(leader) if leader else None
            return (leader, standby) if leader and standby else None

        return self._wait(whole, timeout, "the cluster to be whole (a leader and a synchronous standby)")

    def _wait(self, predicate: Any, timeout: float, what: str) -> Any:
        try:
            return wait_until(predicate, timeout, 0.05, what)
        except TimeoutError as e:
            raise TimeoutError(f"{e}\n" + "\n".join(n.log_tail() for n in self.nodes)) from None

    # -- faults and operations --------------------------------------------------------------------------------

    def kill_postmaster(self, node: Node) -> int:
        """``kill -9`` of the node's postmaster (Patroni stays up); returns the pid killed."""
        pid = node.postmaster_pid()
        if pid is None:
            raise RuntimeError(f"{node.name} has no running postmaster\n{node.log_tail()}")
        os.kill(pid, signal.SIGKILL)
        return pid

    def switchover(self, leader: Node, candidate: Node, timeout: float = 60.0) -> httpx.Response:
        """A planned switchover through the leader's REST API (what ``patronictl switchover`` does); Patroni
        answers once it is done (it polls in steps of 1 s: time it from outside)."""
        return httpx.post(
            f"http://127.0.0.1:{leader.rest_port}/switchover",
            json={"leader": leader.name, "candidate": candidate.name},
            timeout=timeout,
        )

    # -- teardown ---------------------------------------------------------------------------------------------

    def stop(self) -> None:
        """Stop everything by pid, whatever state it is in."""
        for node in self.nodes:
            if node.proc is not None and node.proc.poll() is None:
                _signal_and_wait(node.proc.pid, signal.SIGTERM, 20.0)  # Patroni stops its PostgreSQL first
                with contextlib.suppress(subprocess.TimeoutExpired):
                    node.proc.wait(5)
        for node in self.nodes:
            pid = node.postmaster_pid()
            if pid is not None:
                _signal_and_wait(pid, signal.SIGQUIT, 5.0)  # immediate shutdown
        if self.etcd is not None and self.etcd.poll() is None:
            _signal_and_wait(self.etcd.pid, signal.SIGTERM, 5.0)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.etcd.wait(5)


@contextlib.contextmanager
def patroni_cluster(fsync: bool = True, keep: bool = False) -> Iterator[PatroniCluster]:
    """A started :class:`PatroniCluster` in a temporary directory, stopped and removed on exit (the
    directory and its logs are kept with ``keep``)."""
    missing = missing_programs()
    if missing:
        raise RuntimeError(f"{', '.join(missing)} not found: {INSTALL_HINT}")
    base = Path(tempfile.mkdtemp(prefix="awp-ha-", dir="/tmp"))
    try:
        give_to_server_user(base)
        cluster = PatroniCluster(base, fsync=fsync)
        try:
            cluster.start()
            yield cluster
        finally:
            cluster.stop()
    finally:
        if keep:
            print(f"\n[ha] cluster files kept in {base}", flush=True)
        else:
            shutil.rmtree(base, ignore_errors=True)


class WriteProbe:
    """Commits one row at a time into ``awp_ha_probe`` through ``dsn`` (multi-host, read-write) in a thread.

    Each acknowledged commit is recorded with its time (``time.monotonic()``) and the port of the server
    that took it. A commit waits for the synchronous standby, so a recorded write is a durable one; an
    error (the connection lost mid-commit) makes that row's fate unknown, and it is not counted.
    """

    def __init__(self, dsn: str, pause: float = 0.01) -> None:
        self.dsn = dsn
        self.pause = pause
        self.acked: list[tuple[float, int, int]] = []  # (monotonic time, server port, row id)
        self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="ha-write-probe")
        with psycopg.connect(dsn, autocommit=True, connect_timeout=5) as c:
            c.execute("CREATE TABLE IF NOT EXISTS awp_ha_probe (id bigserial PRIMARY KEY, at timestamptz NOT NULL)")

    def __enter__(self) -> WriteProbe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def _loop(self) -> None:
        conn: psycopg.Connection[Any] | None = None
        while not self._stop.is_set():
            try:
                if conn is None:
                    conn = psycopg.connect(self.dsn, autocommit=True, connect_timeout=2)
                row = conn.execute(
                    "INSERT INTO awp_ha_probe (at) VALUES (clock_timestamp()) RETURNING id, inet_server_port()"
                ).fetchone()
                assert row is not None
                self.acked.append((time.monotonic(), int(row[1]), int(row[0])))
            except psycopg.Error:
                self.errors += 1
                if conn is not None:
                    with contextlib.suppress(Exception):
                        conn.close()
                conn = None
            self._stop.wait(self.pause)
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()

    def first_write(self, after: float, port: int | None = None) -> float | None:
        """Time of the first acknowledged write after ``after`` (on the server at ``port``, if given)."""
        for t, p, _ in list(self.acked):
            if t > after and (port is None or p == port):
                return t
        return None

    def wait_write(self, after: float, port: int, timeout: float = 60.0) -> float:
        return wait_until(lambda: self.first_write(after, port), timeout, 0.01, f"a write on port {port}")

    def last_write_before(self, before: float) -> float | None:
        times = [t for t, _, _ in list(self.acked) if t < before]
        return max(times) if times else None

    def lost(self) -> list[int]:
        """Ids of acknowledged rows missing from the database now."""
        ids = [i for _, _, i in self.acked]
        with psycopg.connect(self.dsn, autocommit=True, connect_timeout=5) as c:
            present = {r[0] for r in c.execute("SELECT id FROM awp_ha_probe WHERE id = ANY(%s)", (ids,))}
        return [i for i in ids if i not in present]
