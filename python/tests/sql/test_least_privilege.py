"""Least privilege by default: ``awp db up`` makes a cluster that trusts no TCP login and a password-protected
gateway login, ``awp serve`` uses that login (not a superuser, EXECUTE on the public functions only), and
migration 0007 lets only AWP's roles connect to AWP's database.

One real project cluster (``awp db up`` in a temporary project directory) for the module; the migration test
uses the session's throwaway cluster.
"""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from worker_support import REPO, Workers, apply, mock_task, start_run, wait_run

from awp.dev.localdb import GATEWAY_LOGIN, Server, free_port
from awp_testing.cluster import database_name, fresh_database
from awp_testing.gateway import serve

AWP = [sys.executable, "-c", "import sys; from awp.cli.main import main; sys.exit(main())"]
MIGRATION = REPO / "db" / "migrations" / "0007_connect_privileges.sql"


@dataclass
class Project:
    dir: Path
    port: int
    env: dict[str, str]  # AWP_PROJECT_DIR, AWP_DB_PORT and no AWP_DATABASE_URL: the defaults are under test
    admin_dsn: str  # the superuser over the unix socket (last line of `awp db up`)
    gateway_dsn: str  # awp_gateway_login over TCP, password in .awp/gateway.pgpass

    def awp(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([*AWP, *args], env=self.env, cwd=REPO, capture_output=True, text=True, timeout=120)
        if check:
            assert proc.returncode == 0, proc.stdout + proc.stderr
        return proc


def db_up(project: Project) -> tuple[str, str]:
    lines = project.awp("db", "up").stdout.strip().splitlines()
    assert lines[-2].startswith("gateway (awp serve): "), lines
    return lines[-1], lines[-2].removeprefix("gateway (awp serve): ")


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Project]:
    directory = tmp_path_factory.mktemp("awp-project")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWP_")}
    env |= {"AWP_PROJECT_DIR": str(directory), "AWP_DB_PORT": str(port), "PYTHONUNBUFFERED": "1", "COLUMNS": "200"}
    p = Project(directory, port, env, "", "")
    try:
        p.admin_dsn, p.gateway_dsn = db_up(p)
        yield p
    finally:
        p.awp("db", "down", "--purge", check=False)


def sqlstate_of(dsn: str, query: str) -> str | None:
    """The SQLSTATE ``query`` fails with on a connection to ``dsn`` (None when it succeeds)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        try:
            conn.execute(query)
        except psycopg.Error as e:
            return e.sqlstate
    return None


def login_error(dsn: str) -> str:
    with pytest.raises(psycopg.OperationalError) as info:
        psycopg.connect(dsn, connect_timeout=5).close()
    return str(info.value)


def test_db_up_creates_a_gateway_login_with_a_private_password_file(project: Project) -> None:
    passfile = project.dir / ".awp" / "gateway.pgpass"
    assert stat.S_IMODE(passfile.stat().st_mode) == 0o600
    assert conninfo_to_dict(project.gateway_dsn)["passfile"] == str(passfile)
    assert conninfo_to_dict(project.gateway_dsn)["host"] == "127.0.0.1"
    assert str(conninfo_to_dict(project.admin_dsn)["host"]).startswith("/"), "superuser: over the unix socket"
    with psycopg.connect(project.admin_dsn) as conn:
        login = conn.execute(
            "SELECT rolcanlogin, rolsuper, rolcreaterole, rolcreatedb, rolreplication, rolbypassrls,"
            " pg_has_role(rolname, 'awp_gateway', 'MEMBER'), rolpassword LIKE 'SCRAM-SHA-256$%%'"
            " FROM pg_authid WHERE rolname = %s",
            (GATEWAY_LOGIN,),
        ).fetchone()
        gateway_role = conn.execute("SELECT rolcanlogin FROM pg_roles WHERE rolname = 'awp_gateway'").fetchone()
        encryption = conn.execute("SHOW password_encryption").fetchone()
    assert login == (True, False, False, False, False, False, True, True)
    assert gateway_role == (False,), "awp_gateway itself stays NOLOGIN"
    assert encryption == ("scram-sha-256",)
    password = passfile.read_text().split(":")[-1].strip()
    assert len(password) >= 40 and password not in project.gateway_dsn
    assert project.awp("db", "dsn").stdout.strip() == project.admin_dsn
    assert project.awp("db", "dsn", "--gateway").stdout.strip() == project.gateway_dsn


def test_the_cluster_refuses_a_tcp_login_without_the_password(project: Project) -> None:
    tcp = f"postgresql://{{}}@127.0.0.1:{project.port}/awp"
    assert "no password supplied" in login_error(tcp.format("postgres"))
    assert "no password supplied" in login_error(tcp.format(GATEWAY_LOGIN))
    wrong = make_conninfo(tcp.format(GATEWAY_LOGIN), password="not-the-password")
    assert 'password authentication failed for user "awp_gateway_login"' in login_error(wrong)
    # With the password the gateway login reaches AWP's database, and no other one.
    with psycopg.connect(project.gateway_dsn) as conn:
        assert conn.execute("SELECT current_user").fetchone() == (GATEWAY_LOGIN,)
    other = make_conninfo(project.gateway_dsn, dbname="postgres")
    assert 'permission denied for database "postgres"' in login_error(other)


def test_the_gateway_login_may_only_execute_the_public_functions(project: Project) -> None:
    dsn = project.gateway_dsn
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user").fetchone() == (False,)
        assert conn.execute("SELECT (awp.get_settings())->>'lease_duration_ms'").fetchone() == ("15000",)
    assert sqlstate_of(dsn, "SELECT * FROM awp.list_runs()") is None
    assert sqlstate_of(dsn, "SELECT * FROM awp.runs") == "42501"
    assert sqlstate_of(dsn, "DELETE FROM awp.workers") == "42501"
    assert sqlstate_of(dsn, "UPDATE awp.settings SET lease_duration_ms = 1") == "42501"
    assert sqlstate_of(dsn, "SELECT awp._now()") == "42501"
    assert sqlstate_of(dsn, "SELECT awp._token()") == "42501"
    assert sqlstate_of(dsn, "CREATE TABLE awp.mine (a int)") == "42501"
    assert sqlstate_of(dsn, "CREATE TABLE public.mine (a int)") == "42501"
    assert sqlstate_of(dsn, "CREATE ROLE intruder") == "42501"


def test_awp_serve_runs_as_the_gateway_login_by_default(project: Project) -> None:
    env = {**project.env, "AWP_DATABASE_URL": ""}  # unset: `awp serve` picks the local cluster's gateway login
    with serve("", env=env) as gw, Workers(gw) as workers:
        workers.start("least-privilege")
        run_id = start_run(gw, apply(gw, {"id": "lp", "tasks": [mock_task("a"), mock_task("b", ["a"])]}))
        assert wait_run(gw, run_id)["status"] == "succeeded"
        assert gw.ready()["coordinator_active"] is True  # type: ignore[index]
        with psycopg.connect(project.admin_dsn) as conn:
            sessions = conn.execute(
                "SELECT a.usename, r.rolsuper, count(*) FROM pg_stat_activity a JOIN pg_roles r ON r.oid = a.usesysid"
                " WHERE a.application_name = 'awp-gateway' GROUP BY 1, 2"
            ).fetchall()
        assert [(user, superuser) for user, superuser, _ in sessions] == [(GATEWAY_LOGIN, False)], sessions
        assert sessions[0][2] >= 3, "pool, LISTEN and coordinator connections"
        assert not re.search(r"^ERROR", gw.log_path.read_text(errors="replace"), re.M), gw.log_tail()


def test_the_demo_on_the_local_cluster_serves_as_the_gateway_login(project: Project) -> None:
    demo = project.awp("demo", "--fast")
    assert f"database login {GATEWAY_LOGIN}" in demo.stdout, demo.stdout
    assert "30 tasks: succeeded 30" in demo.stdout, demo.stdout


def test_db_up_again_keeps_the_password_and_locks_a_trusting_cluster_again(project: Project) -> None:
    passfile = project.dir / ".awp" / "gateway.pgpass"
    before = passfile.read_text()
    with psycopg.connect(project.admin_dsn, autocommit=True) as conn:  # a cluster from before: trust over TCP
        hba = conn.execute("SHOW hba_file").fetchone()[0]  # type: ignore[index]
    Path(hba).write_text("local all all trust\nhost all all 127.0.0.1/32 trust\n")
    with psycopg.connect(project.admin_dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_reload_conf()")
    trusting = f"postgresql://postgres@127.0.0.1:{project.port}/awp"
    with psycopg.connect(trusting) as conn:
        assert conn.execute("SELECT current_user").fetchone() == ("postgres",)

    admin, gateway = db_up(project)
    assert (admin, gateway) == (project.admin_dsn, project.gateway_dsn)
    assert passfile.read_text() == before
    assert "no password supplied" in login_error(trusting)
    with psycopg.connect(gateway) as conn:
        assert conn.execute("SELECT current_user").fetchone() == (GATEWAY_LOGIN,)


def test_serve_without_a_gateway_login_says_to_run_db_up(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWP_")}
    env |= {"AWP_PROJECT_DIR": str(tmp_path), "AWP_VIEWER_TOKEN": "v" * 32, "AWP_OPERATOR_TOKEN": "o" * 32}
    env |= {"AWP_WORKER_BOOTSTRAP_TOKEN": "b" * 32}
    proc = subprocess.run([*AWP, "serve", "--port", "1"], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "no gateway login for the local cluster" in proc.stderr and "awp db up" in proc.stderr


def test_migration_0007_lets_only_awp_roles_connect(pg_cluster: Server) -> None:
    name = database_name("connect")
    dsn = fresh_database(pg_cluster, name)
    login, stranger = f"lp_gw_{name[-8:]}", f"lp_x_{name[-8:]}"
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE ROLE {} LOGIN IN ROLE awp_gateway").format(sql.Identifier(login)))
            conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(stranger)))
            privileges = conn.execute(
                "SELECT has_database_privilege('public', current_database(), 'CONNECT'),"
                " has_database_privilege('awp_gateway', current_database(), 'CONNECT'),"
                " has_database_privilege('awp_owner', current_database(), 'CONNECT')"
            ).fetchone()
            assert privileges == (False, True, True)
            acl = "SELECT datacl::text[] FROM pg_database WHERE datname = %s"
            before = conn.execute(acl, (name,)).fetchone()
            conn.execute(MIGRATION.read_text())  # idempotent: applying it again changes nothing
            assert conn.execute(acl, (name,)).fetchone() == before
        with psycopg.connect(make_conninfo(dsn, user=login)) as conn:
            assert conn.execute("SELECT current_user").fetchone() == (login,)
        assert f'permission denied for database "{name}"' in login_error(make_conninfo(dsn, user=stranger))
    finally:
        pg_cluster.drop_database(name)
        with psycopg.connect(pg_cluster.admin_dsn(), autocommit=True) as conn:
            for role in (login, stranger):
                conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))
