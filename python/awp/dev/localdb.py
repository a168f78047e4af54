"""A local PostgreSQL cluster: the embedded default behind ``awp db up`` and the test suite.

PostgreSQL refuses to run as root, so when we are root every server program runs as the ``postgres`` OS
user (``runuser -u postgres --``) and the directories it writes are chowned to that user. The data
directory must be reachable by that user: ``project_cluster`` falls back to
``/tmp/awp-pgdata-<hash of the project path>`` when the project lives somewhere ``postgres`` cannot
traverse (e.g. under ``/root``) and records the choice in ``.awp/cluster.json``.

The project's cluster (``awp db up``) trusts no TCP login: its ``pg_hba.conf`` asks every TCP login for a
scram-sha-256 password; the superuser ``postgres`` logs in over the unix socket only (its directory is mode
0700, so only this OS user and root reach it): :meth:`Cluster.dsn` is that socket. ``awp serve`` logs in as
``awp_gateway_login`` (a member of the execute-only role ``awp_gateway``) over TCP with the password kept in
``.awp/gateway.pgpass`` (mode 0600, read by libpq as its ``passfile``): :func:`gateway_database_url`.
Throwaway test clusters (:mod:`awp_testing.cluster`) keep trust authentication.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import pwd
import secrets
import shlex
import shutil
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from awp.dev.pgbin import pg_bin

log = logging.getLogger("awp.localdb")  # the log's name, not the module's (docs/operations.md, Logs)

DEFAULT_PORT = 54329
DEFAULT_DBNAME = "awp"
PG_OS_USER = "postgres"
GATEWAY_ROLE = "awp_gateway"  # NOLOGIN, EXECUTE on the public awp functions only (db/functions/zz_grants.sql)
GATEWAY_LOGIN = "awp_gateway_login"  # the login `awp serve` uses on the local cluster: a member of GATEWAY_ROLE
_SOCKET_PATH_MAX = 100  # sun_path is 108 bytes; leave room for "/.s.PGSQL.NNNNN"


class ClusterError(RuntimeError):
    """A PostgreSQL program failed; the message carries its output."""


def is_root() -> bool:
    return os.geteuid() == 0


def _postgres_ids() -> tuple[int, int]:
    try:
        pw = pwd.getpwnam(PG_OS_USER)
    except KeyError as e:
        raise ClusterError(
            f"running as root, but there is no OS user {PG_OS_USER!r} to run PostgreSQL as; "
            "installing the postgresql package creates it (or: useradd --system postgres)"
        ) from e
    return pw.pw_uid, pw.pw_gid


def as_server_user(cmd: list[str]) -> list[str]:
    """``cmd`` run as the server's OS user (``postgres``) when we are root; as is otherwise."""
    if is_root():
        _postgres_ids()
        return ["runuser", "-u", PG_OS_USER, "--", *cmd]
    return cmd


def give_to_server_user(path: Path) -> None:
    """Make ``path`` (a directory we created) owned by the server user when we are root."""
    if is_root():
        uid, gid = _postgres_ids()
        os.chown(path, uid, gid)


def server_user_can_traverse(path: Path) -> bool:
    """True when the OS user the server runs as can reach ``path`` (search permission on it and above)."""
    if not is_root():
        return os.access(path, os.X_OK)
    res = subprocess.run(as_server_user(["test", "-x", str(path)]), cwd="/", capture_output=True)
    return res.returncode == 0


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """Something that hands out DSNs and can create and drop databases."""

    def dsn(self, dbname: str = "postgres") -> str:
        raise NotImplementedError

    def admin_dsn(self) -> str:
        return self.dsn("postgres")

    def database_exists(self, name: str) -> bool:
        with psycopg.connect(self.admin_dsn(), autocommit=True) as conn:
            row = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
            return row is not None

    def create_database(self, name: str, exist_ok: bool = False) -> str:
        """Create database ``name`` and return its DSN."""
        with psycopg.connect(self.admin_dsn(), autocommit=True) as conn:
            exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
            if exists and not exist_ok:
                raise ClusterError(f"database {name!r} already exists")
            if not exists:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
                log.info("created database %s", name)
        return self.dsn(name)

    def drop_database(self, name: str) -> None:
        """Drop database ``name`` if it exists, disconnecting its sessions."""
        with psycopg.connect(self.admin_dsn(), autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        log.info("dropped database %s", name)


class ExternalServer(Server):
    """An existing PostgreSQL server given by a DSN (``AWP_DATABASE_URL`` or ``AWP_TEST_DSN``)."""

    def __init__(self, dsn: str) -> None:
        self._dsn = dsn

    def dsn(self, dbname: str = "postgres") -> str:
        return make_conninfo(self._dsn, dbname=dbname)

    def admin_dsn(self) -> str:
        return self._dsn

    def __repr__(self) -> str:
        return f"ExternalServer({psycopg.conninfo.conninfo_to_dict(self._dsn).get('host', 'local')!r})"


@dataclass(frozen=True)
class ClusterStatus:
    initialized: bool
    running: bool
    pid: int | None


class Cluster(Server):
    """A PostgreSQL cluster in ``datadir`` listening on 127.0.0.1:``port`` and a socket in ``socket_dir``.

    ``admin_socket=True`` (the project's cluster): :meth:`dsn` logs the superuser in over the unix socket,
    since :meth:`require_tcp_passwords` makes every TCP login need a password. Otherwise (throwaway test
    clusters, trust authentication) :meth:`dsn` is TCP on 127.0.0.1.
    """

    def __init__(
        self, datadir: Path | str, port: int, socket_dir: Path | str | None = None, admin_socket: bool = False
    ) -> None:
        self.datadir = Path(datadir).absolute()
        self.port = port
        self.socket_dir = Path(socket_dir).absolute() if socket_dir else self.datadir.parent / "run"
        self.logfile = self.datadir / "server.log"
        self.admin_socket = admin_socket

    def __repr__(self) -> str:
        return f"Cluster({str(self.datadir)!r}, port={self.port})"

    # -- programs ---------------------------------------------------------------------------------------

    def _run(self, cmd: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
        full = as_server_user(cmd)
        log.debug("running %s", shlex.join(full))
        res = subprocess.run(full, cwd="/", capture_output=True, text=True)
        if check and res.returncode != 0:
            raise ClusterError(
                f"{shlex.join(cmd)} failed (exit {res.returncode}):\n{res.stdout}{res.stderr}{self._log_tail()}"
            )
        return res

    def _log_tail(self, lines: int = 20) -> str:
        try:
            tail = self.logfile.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            return ""
        return f"\n--- last lines of {self.logfile} ---\n" + "\n".join(tail)

    def _mkdir_for_server(self, path: Path) -> None:
        path.mkdir(parents=True, exist_ok=True)
        give_to_server_user(path)
        path.chmod(0o700)

    # -- lifecycle --------------------------------------------------------------------------------------

    def init(self, sync: bool = True) -> None:
        """initdb (trust auth, superuser ``postgres``, UTF8). ``sync=False`` skips initdb's fsync."""
        if (self.datadir / "PG_VERSION").exists():
            raise ClusterError(f"{self.datadir} already holds a cluster")
        self._mkdir_for_server(self.datadir)
        cmd = [
            pg_bin("initdb"), "-D", str(self.datadir), "-U", "postgres", "--auth=trust",
            "--encoding=UTF8", "--no-locale",
        ]  # fmt: skip
        if not sync:
            cmd.append("--no-sync")
        self._run(cmd)
        log.info("initialized cluster in %s", self.datadir)

    def start(self, fsync: bool = True) -> None:
        """Start the server and wait until it accepts connections.

        ``fsync=False`` also turns off synchronous_commit and full_page_writes: fast, and a crash of the
        machine loses the cluster. For throwaway test clusters only.
        """
        if len(str(self.socket_dir)) > _SOCKET_PATH_MAX:
            raise ClusterError(f"socket directory path is too long for a unix socket: {self.socket_dir}")
        self._mkdir_for_server(self.socket_dir)
        settings = {
            "listen_addresses": "127.0.0.1",
            "port": str(self.port),
            "unix_socket_directories": str(self.socket_dir),
            "max_connections": "200",
            "shared_buffers": "128MB",
            "logging_collector": "off",
            "password_encryption": "scram-sha-256",
        }
        if not fsync:
            settings |= {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"}
        opts = " ".join(f"-c {shlex.quote(f'{k}={v}')}" for k, v in settings.items())
        cmd = [pg_bin("pg_ctl"), "start", "-w", "-t", "60", "-D", str(self.datadir), "-l", str(self.logfile)]
        self._run([*cmd, "-o", opts])
        log.info("started PostgreSQL on 127.0.0.1:%d (data %s)", self.port, self.datadir)

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (``mode``: smart, fast or immediate); a stopped server is left alone."""
        if not self.status().running:
            return
        self._run([pg_bin("pg_ctl"), "stop", "-w", "-t", "60", "-m", mode, "-D", str(self.datadir)])
        log.info("stopped PostgreSQL (data %s)", self.datadir)

    def status(self) -> ClusterStatus:
        if not (self.datadir / "PG_VERSION").exists():
            return ClusterStatus(initialized=False, running=False, pid=None)
        res = self._run([pg_bin("pg_ctl"), "status", "-D", str(self.datadir)], check=False)
        pid = None
        if res.returncode == 0:
            with contextlib.suppress(OSError, ValueError, IndexError):
                pid = int((self.datadir / "postmaster.pid").read_text().split()[0])
        return ClusterStatus(initialized=True, running=res.returncode == 0, pid=pid)

    def dsn(self, dbname: str = "postgres") -> str:
        """The superuser's DSN: over the unix socket when ``admin_socket``, else TCP on 127.0.0.1."""
        if self.admin_socket:  # libpq: a percent-encoded absolute path as host is a socket directory
            return f"postgresql://postgres@{quote(str(self.socket_dir), safe='')}:{self.port}/{dbname}"
        return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}"

    def tcp_dsn(self, dbname: str, user: str, passfile: Path | None = None) -> str:
        """A TCP DSN for ``user``; libpq reads the password from ``passfile`` (a .pgpass file, mode 0600)."""
        dsn = f"postgresql://{quote(user, safe='')}@127.0.0.1:{self.port}/{quote(dbname, safe='')}"
        return dsn + (f"?passfile={quote(str(passfile), safe='')}" if passfile else "")

    def require_tcp_passwords(self) -> None:
        """Write ``pg_hba.conf``: every TCP login needs a scram-sha-256 password; over the unix socket
        the superuser ``postgres`` is trusted (the socket directory is mode 0700), anyone else needs a
        password. Reloads a running server; idempotent (``awp db up`` calls it every time)."""
        hba = self.datadir / "pg_hba.conf"
        text = (
            "# Written by `awp db up` (python/awp/dev/localdb.py, Cluster.require_tcp_passwords) on every run.\n"
            "# TYPE  DATABASE     USER      ADDRESS        METHOD\n"
            "local   all          postgres                 trust\n"
            "local   replication  postgres                 trust\n"
            "local   all          all                      scram-sha-256\n"
            "host    all          all       127.0.0.1/32   scram-sha-256\n"
            "host    all          all       ::1/128        scram-sha-256\n"
        )
        if hba.exists() and hba.read_text() == text:
            return
        hba.write_text(text)  # as root too: root may write into the server user's 0700 directory
        hba.chmod(0o600)
        if is_root():
            os.chown(hba, *_postgres_ids())
        log.info("pg_hba.conf of %s: TCP logins need a password (scram-sha-256)", self.datadir)
        if self.status().running:
            self._run([pg_bin("pg_ctl"), "reload", "-D", str(self.datadir)])


# -- the project's cluster (awp db up|down|status) -------------------------------------------------------


def find_project_dir(start: Path | None = None) -> Path:
    """``AWP_PROJECT_DIR``, else the nearest directory upwards holding ``.awp/``, else the current one."""
    env = os.environ.get("AWP_PROJECT_DIR")
    if env:
        return Path(env).absolute()
    here = (start or Path.cwd()).absolute()
    for d in (here, *here.parents):
        if (d / ".awp").is_dir():
            return d
    return here


def _record_path(project_dir: Path) -> Path:
    return project_dir / ".awp" / "cluster.json"


def _fallback_base(project_dir: Path) -> Path:
    digest = hashlib.sha256(str(project_dir.resolve()).encode()).hexdigest()[:12]
    return Path("/tmp") / f"awp-pgdata-{digest}"


def _ensure_private_base(base: Path) -> None:
    """Create a directory under /tmp for the cluster and refuse one a stranger created first."""
    base.mkdir(mode=0o700, exist_ok=True)
    owner = base.stat().st_uid
    allowed = {os.geteuid()} | ({_postgres_ids()[0]} if is_root() else set())
    if owner not in allowed:
        raise ClusterError(f"{base} exists and belongs to uid {owner}; remove it or set AWP_PROJECT_DIR")
    give_to_server_user(base)


def project_cluster(project_dir: Path | None = None, create: bool = False) -> Cluster:
    """The cluster kept for a project under ``.awp/`` (or its recorded /tmp fallback).

    Port: ``AWP_DB_PORT``, else the recorded one, else 54329. With ``create=True`` the directories are
    made, the location is chosen (``.awp/pgdata`` if the server user can reach it, else
    ``/tmp/awp-pgdata-<hash>``) and recorded in ``.awp/cluster.json``.
    """
    project_dir = (project_dir or find_project_dir()).absolute()
    awp_dir = project_dir / ".awp"
    record: dict[str, Any] = {}  # what cluster.json holds (JSON)
    with contextlib.suppress(OSError, ValueError):
        record = json.loads(_record_path(project_dir).read_text())
    port = int(os.environ.get("AWP_DB_PORT") or record.get("port") or DEFAULT_PORT)
    if record.get("datadir") and not create:
        return Cluster(str(record["datadir"]), port, str(record.get("socket_dir") or "") or None, admin_socket=True)
    if not create:
        return Cluster(awp_dir / "pgdata", port, awp_dir / "run", admin_socket=True)

    awp_dir.mkdir(parents=True, exist_ok=True)
    if record.get("datadir"):
        cluster = Cluster(str(record["datadir"]), port, str(record.get("socket_dir") or "") or None, admin_socket=True)
        if cluster.datadir.parent != awp_dir:
            _ensure_private_base(cluster.datadir.parent)
    else:
        if is_root():
            os.chmod(awp_dir, 0o755)
        base = awp_dir
        if not server_user_can_traverse(awp_dir) or len(str(awp_dir / "run")) > _SOCKET_PATH_MAX:
            base = _fallback_base(project_dir)
            _ensure_private_base(base)
            log.info("cluster data for %s goes to %s (project path unreachable or too long)", project_dir, base)
        cluster = Cluster(base / "pgdata", port, base / "run", admin_socket=True)
    _record_path(project_dir).write_text(
        json.dumps({"datadir": str(cluster.datadir), "socket_dir": str(cluster.socket_dir), "port": port}, indent=2)
        + "\n"
    )
    return cluster


def purge_project_cluster(project_dir: Path | None = None) -> None:
    """Remove the project's cluster data (stop it first) and its record."""
    project_dir = (project_dir or find_project_dir()).absolute()
    cluster = project_cluster(project_dir)
    cluster.stop()
    awp_dir = project_dir / ".awp"
    for path in (cluster.datadir, cluster.socket_dir):
        shutil.rmtree(path, ignore_errors=True)
    base = cluster.datadir.parent
    if base != awp_dir and base.name.startswith("awp-pgdata-"):
        shutil.rmtree(base, ignore_errors=True)
    _record_path(project_dir).unlink(missing_ok=True)
    gateway_passfile(project_dir).unlink(missing_ok=True)


def default_database_url(project_dir: Path | None = None) -> str:
    """``AWP_DATABASE_URL`` when set, else the superuser's DSN (unix socket) of the local cluster's database
    ``awp``: for migrations and the admin commands (``awp db migrate``, ``awp check``, ``awp prune``)."""
    return os.environ.get("AWP_DATABASE_URL") or project_cluster(project_dir).dsn(DEFAULT_DBNAME)


# -- the gateway's login ---------------------------------------------------------------------------------


def gateway_passfile(project_dir: Path | None = None) -> Path:
    """``.awp/gateway.pgpass``: the gateway login's password as a libpq password file (mode 0600)."""
    return (project_dir or find_project_dir()).absolute() / ".awp" / "gateway.pgpass"


def gateway_database_url(project_dir: Path | None = None) -> str:
    """The DSN ``awp serve`` uses by default: ``AWP_DATABASE_URL`` when set, else the local cluster's
    database ``awp`` over TCP as ``awp_gateway_login``, its password in :func:`gateway_passfile`."""
    env = os.environ.get("AWP_DATABASE_URL")
    if env:
        return env
    project_dir = (project_dir or find_project_dir()).absolute()
    passfile = gateway_passfile(project_dir)
    if not passfile.exists():
        raise ClusterError(
            f"no gateway login for the local cluster ({passfile} is missing): run `awp db up` "
            "(or set AWP_DATABASE_URL / --database-url)"
        )
    return project_cluster(project_dir).tcp_dsn(DEFAULT_DBNAME, GATEWAY_LOGIN, passfile)


def _read_or_create_password(passfile: Path, login: str) -> str:
    """The login's password from ``passfile`` (a .pgpass line ``*:*:*:login:password``), else a new random
    one written there with mode 0600 (created 0600 from the start, then renamed into place)."""
    with contextlib.suppress(OSError):
        for line in passfile.read_text().splitlines():
            parts = line.split(":")
            if len(parts) == 5 and parts[3] == login and parts[4]:
                if passfile.stat().st_mode & 0o077:
                    passfile.chmod(0o600)  # libpq ignores a password file that others may read
                return parts[4]
    password = secrets.token_urlsafe(32)  # no ':' or '\\': nothing to escape in the .pgpass format
    passfile.parent.mkdir(parents=True, exist_ok=True)
    tmp = passfile.with_name(passfile.name + ".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(f"*:*:*:{login}:{password}\n")
    os.replace(tmp, passfile)
    return password


def ensure_gateway_login(admin_dsn: str, password: str, login: str = GATEWAY_LOGIN) -> None:
    """Create (or update) ``login``: LOGIN, no special attribute, member of ``awp_gateway`` (created NOLOGIN
    when missing, as migration 0001 does), password ``password`` stored as a scram-sha-256 verifier
    (hashed here: the password itself never reaches the server). Idempotent."""
    ident = sql.Identifier(login)
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        verifier = conn.pgconn.encrypt_password(password.encode(), login.encode(), b"scram-sha-256").decode()
        attrs = sql.SQL(
            "LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS INHERIT PASSWORD {}"
        ).format(sql.Literal(verifier))
        with conn.transaction():
            if conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (GATEWAY_ROLE,)).fetchone() is None:
                conn.execute(sql.SQL("CREATE ROLE {} NOLOGIN").format(sql.Identifier(GATEWAY_ROLE)))
            exists = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (login,)).fetchone()
            verb = "ALTER ROLE {} WITH " if exists else "CREATE ROLE {} WITH "
            conn.execute(sql.SQL(verb).format(ident) + attrs)
            conn.execute(sql.SQL("GRANT {} TO {}").format(sql.Identifier(GATEWAY_ROLE), ident))
    log.info("gateway login %s ready (member of %s)", login, GATEWAY_ROLE)


@dataclass
class LocalDatabase:
    """What :func:`up_project_database` set up."""

    cluster: Cluster
    admin_dsn: str  # superuser over the unix socket: migrations, awp check, awp prune
    gateway_dsn: str  # awp_gateway_login over TCP with its password file: awp serve
    started: bool  # the server was started now (it was not running)
    applied: list[str]  # migrations applied now


def up_project_database(project_dir: Path | None = None, run_migrate: bool = True) -> LocalDatabase:
    """``awp db up`` (and ``awp demo``): create (first time) and start the project's cluster with TCP logins
    needing a password, create database ``awp``, migrate it, and create the gateway login with its password
    file. Idempotent; also brings a cluster made before any of this (trust auth) up to date."""
    from awp.dev.migrate import migrate

    project_dir = (project_dir or find_project_dir()).absolute()
    cluster = project_cluster(project_dir, create=True)
    status = cluster.status()
    if not status.initialized:
        cluster.init()
    cluster.require_tcp_passwords()
    if not status.running:
        cluster.start(fsync=True)
    admin = cluster.create_database(DEFAULT_DBNAME, exist_ok=True)
    applied = migrate(admin) if run_migrate else []
    passfile = gateway_passfile(project_dir)
    ensure_gateway_login(admin, _read_or_create_password(passfile, GATEWAY_LOGIN))
    with psycopg.connect(cluster.dsn("postgres"), autocommit=True) as conn:  # only AWP's roles reach awp
        for name in ("postgres", "template1"):
            conn.execute(sql.SQL("REVOKE CONNECT ON DATABASE {} FROM PUBLIC").format(sql.Identifier(name)))
    gateway = cluster.tcp_dsn(DEFAULT_DBNAME, GATEWAY_LOGIN, passfile)
    return LocalDatabase(cluster, admin, gateway, started=not status.running, applied=applied)
