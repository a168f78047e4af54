"""The PL/Proxy router (docs/scale-out.md): ``awp router init`` and ``awp router add-shard``.

The router is a PostgreSQL database whose public ``awp.*`` functions have the signatures of a shard's and run the
real ones on the shards (PL/Proxy). Its SQL: ``db/router/00_router.sql`` (the shards' table, PL/Proxy's cluster
configuration, the routing helpers), then the proxies made here from a shard's catalog (:func:`proxies_sql`: one
``awp_shard.<name>(shard, ...)`` per public function, and the public ``awp.<name>`` of every function whose rule in
:data:`RULES` is one call or the same call on every shard), then ``db/router/20_wrappers.sql`` (the rest, by hand).
Generating the proxies from the catalog keeps their signatures the shard's; :data:`RULES` must name every public
function (python/tests/sql/test_router.py), so a new function cannot be forgotten.
"""

from __future__ import annotations

import logging
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.types.json import Jsonb

from awp.dev.migrate import default_sql_dir, migrate

log = logging.getLogger("awp.migrate")

ROUTER_LOGIN = "awp_router_login"  # the router's login on each shard: a member of awp_router (migration 0024)
# The lock_timeout of the router's sessions on a shard: the gateway's default (--lock-timeout-ms, 2 s). A gateway
# sets its own on its router session, which PL/Proxy does not carry to the shards (docs/scale-out.md).
ROUTER_LOCK_TIMEOUT = "2s"
CLUSTER = "awp"

# How the router runs each public function of a shard:
#   run:<arg> / dispatch:<arg>  on the shard of that run id or dispatch id (awp_router.shard_of)
#   key:<arg>                   on the shard of that key (awp_router.shard_for_key): schedules
#   first                       on shard 0: what every shard holds alike (workflows, settings) or only shard 0
#                               holds (dashboard sessions)
#   all_first                   on every shard, shard 0 first; answers shard 0's result (definitions and settings)
#   all_sum                     on every shard; JSON counters added up (awp_router.jsonb_sum)
#   all_union                   on every shard at once (RUN ON ALL); every shard's rows
#   custom                      by hand in db/router/20_wrappers.sql
#   shard                       not on the router: the coordinator's and the DBA's maintenance, run on each shard
RULES: dict[str, str] = {
    # runs
    "get_run": "run:p_run_id",
    "run_revision": "run:p_run_id",
    "run_tasks": "run:p_run_id",
    "get_task": "run:p_run_id",
    "task_attempts": "run:p_run_id",
    "run_events": "run:p_run_id",
    "task_logs": "run:p_run_id",
    "run_stream": "run:p_run_id",
    "run_waits": "run:p_run_id",
    "request_cancel": "run:p_run_id",
    "send_signal": "run:p_run_id",
    "retry_run": "run:p_run_id",
    "retry_run_idempotent": "run:p_run_id",
    "start_run": "custom",
    "start_run_idempotent": "custom",
    "start_runs": "custom",
    "start_runs_idempotent": "custom",
    "list_runs": "custom",
    # the worker protocol
    "complete_task": "dispatch:p_dispatch_id",
    "release_lease": "dispatch:p_dispatch_id",
    "report_progress": "dispatch:p_dispatch_id",
    "register_worker": "custom",
    "check_worker_session": "first",
    "worker_status": "first",
    "claim_tasks": "custom",
    "heartbeat": "custom",
    "complete_and_claim": "custom",
    "complete_and_claim_many": "custom",
    "complete_tasks": "custom",
    "report_progress_many": "custom",
    "drain_worker": "custom",
    "request_drain": "custom",
    "get_worker": "custom",
    "list_workers": "custom",
    # workflows, settings, limits, schedules
    "apply_workflow": "all_first",
    "apply_workflow_idempotent": "all_first",
    "create_workflow_version": "all_first",
    "list_workflows": "first",
    "get_workflow": "first",
    "workflow_versions": "first",
    "get_workflow_version": "first",
    "configure": "all_first",
    "get_settings": "first",
    "set_limit": "all_first",
    "delete_limit": "all_first",
    "get_limit": "custom",
    "list_limits": "custom",
    "create_schedule": "key:schedule_id",
    "delete_schedule": "key:schedule_id",
    "list_schedules": "custom",
    # dashboard sessions (one table, on shard 0)
    "revoke_ui_session": "first",
    "ui_session_revoked": "first",
    # counts and checks
    "cluster_status": "all_sum",
    "executor_stats": "all_sum",
    "metrics_snapshot": "all_sum",
    "prune": "all_sum",
    "check_invariants": "all_union",
    "transitions": "first",
    # each shard's own coordinator and maintenance
    "apply_retention": "shard",
    "coordinator_tick": "shard",
    "take_leadership": "shard",
    "leader_heartbeat": "shard",
    "get_leader": "shard",
    "mark_offline_workers": "shard",
    "converge_cancellations": "shard",
    "reap_expired_leases": "shard",
    "promote_retries": "shard",
    "next_due_ms": "shard",
    "withdraw_orphan_dispatches": "shard",
    "create_dispatches": "shard",
    "fire_schedules": "shard",
    "cancel_waiting_runs": "shard",
    "maintain_partitions": "shard",
    "refresh_statistics": "shard",
}
# Internal shard functions the router calls (granted to awp_router on the shards: db/functions/zz_grants.sql).
INTERNAL = ("_worker_record", "_adopt_worker")
# One-shard functions that also get an every-shard form awp_shard.<name>_all (RUN ON ALL), for merged lists.
ALL_FORMS = ("list_runs", "list_schedules", "list_limits")


@dataclass(frozen=True)
class Function:
    name: str
    identity_args: str  # "p_run_id text, p_after bigint"
    args: str  # with defaults
    result: str  # "TABLE(...)", "SETOF awp.lease", "jsonb"
    returns_set: bool
    arg_names: tuple[str, ...]
    nargs: int

    def call_args(self, first: int) -> str:
        return ", ".join(f"${i}" for i in range(first, first + self.nargs))


def shard_functions(conn: psycopg.Connection[Any]) -> list[Function]:
    """The public functions of schema awp on a shard (and the internal ones the router calls)."""
    rows = conn.execute(
        "SELECT p.proname, pg_get_function_identity_arguments(p.oid), pg_get_function_arguments(p.oid),"
        "       pg_get_function_result(p.oid), p.proretset, coalesce(p.proargnames, '{}'), p.pronargs"
        "  FROM pg_proc p WHERE p.pronamespace = 'awp'::regnamespace"
        "   AND (p.proname !~ '^_' OR p.proname = ANY (%s)) ORDER BY 1, 2",
        (list(INTERNAL),),
    ).fetchall()
    return [Function(r[0], r[1], r[2], r[3], r[4], tuple(r[5]), r[6]) for r in rows]


def composite_types_sql(conn: psycopg.Connection[Any]) -> str:
    """CREATE TYPE for each composite type of schema awp that a public function returns (awp.lease, awp.schedules)."""
    out = []
    for (typ,) in conn.execute(
        "SELECT DISTINCT t.typname FROM pg_proc p JOIN pg_type t ON t.oid = p.prorettype"
        " WHERE p.pronamespace = 'awp'::regnamespace AND t.typnamespace = 'awp'::regnamespace"
        "   AND t.typtype = 'c' ORDER BY 1"
    ).fetchall():
        cols = conn.execute(
            "SELECT quote_ident(a.attname) || ' ' || format_type(a.atttypid, a.atttypmod) FROM pg_attribute a"
            " WHERE a.attrelid = ('awp.' || quote_ident(%s))::regclass AND a.attnum > 0 AND NOT a.attisdropped"
            " ORDER BY a.attnum",
            (typ,),
        ).fetchall()
        out.append(f"CREATE TYPE awp.{typ} AS ({', '.join(c[0] for c in cols)});")
    return "\n".join(out)


def _proxy(name: str, args: str, f: Function, run_on: str, first: int) -> str:
    """A PL/Proxy function ``name(args)`` that runs ``awp.<f>`` on the shards of ``run_on`` with its arguments from
    ``$first`` on."""
    return (
        f"CREATE FUNCTION {name}({args}) RETURNS {f.result}\n"
        f"LANGUAGE plproxy AS $p$ CLUSTER '{CLUSTER}'; RUN ON {run_on};"
        f" SELECT * FROM awp.{f.name}({f.call_args(first)}); $p$;"
    )


def _definer(body: str) -> str:
    return body.replace(
        "LANGUAGE plproxy AS", "LANGUAGE plproxy SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS", 1
    )


def _arg_index(f: Function, arg: str) -> int:
    if arg not in f.arg_names:
        raise ValueError(f"awp.{f.name}({f.identity_args}) has no argument {arg} (awp.dev.router.RULES)")
    return f.arg_names.index(arg) + 1


def _fan_out(f: Function, combine: str) -> str:
    """A PL/pgSQL awp.<name> that calls awp_shard.<name> on every shard, shard 0 first."""
    call = f.call_args(1)
    head = (
        f"CREATE FUNCTION awp.{f.name}({f.args}) RETURNS {f.result}\n"
        "LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $f$\n"
    )
    shards = "SELECT * FROM awp_router.other_shards(0)"
    if f.returns_set:
        if combine != "first":
            raise ValueError(f"awp.{f.name}: a set can only be answered by shard 0 (rule all_first)")
        return head + (
            "DECLARE v_shard integer;\nBEGIN\n"
            f"  RETURN QUERY SELECT * FROM awp_shard.{f.name}(0{', ' if call else ''}{call});\n"
            f"  FOR v_shard IN {shards} LOOP\n"
            f"    PERFORM * FROM awp_shard.{f.name}(v_shard{', ' if call else ''}{call});\n"
            "  END LOOP;\nEND $f$;"
        )
    step = (
        f"awp_router.jsonb_sum(v_answer, awp_shard.{f.name}(v_shard{', ' if call else ''}{call}))"
        if combine == "sum"
        else None
    )
    loop = (
        f"    v_answer := {step};\n"
        if step
        else f"    PERFORM awp_shard.{f.name}(v_shard{', ' if call else ''}{call});\n"
    )
    return head + (
        f"DECLARE v_shard integer; v_answer {f.result};\nBEGIN\n"
        f"  v_answer := awp_shard.{f.name}(0{', ' if call else ''}{call});\n"
        f"  FOR v_shard IN {shards} LOOP\n{loop}  END LOOP;\n  RETURN v_answer;\nEND $f$;"
    )


def proxies_sql(conn: psycopg.Connection[Any]) -> str:
    """The router's generated part, from the shard at ``conn``: schemas awp and awp_shard made anew, the composite
    types, one awp_shard.<name>(shard, ...) per function, and the public awp.<name> of every rule but custom."""
    functions = shard_functions(conn)
    unknown = sorted({f.name for f in functions if not f.name.startswith("_")} - set(RULES))
    if unknown:
        raise ValueError(f"no router rule for {', '.join(unknown)} (awp.dev.router.RULES)")
    parts = [
        "DROP SCHEMA IF EXISTS awp CASCADE;",
        "DROP SCHEMA IF EXISTS awp_shard CASCADE;",
        "CREATE SCHEMA awp AUTHORIZATION awp_owner;",
        "REVOKE ALL ON SCHEMA awp FROM PUBLIC;",
        "GRANT USAGE ON SCHEMA awp TO awp_gateway;",
        "CREATE SCHEMA awp_shard AUTHORIZATION awp_owner;",
        "REVOKE ALL ON SCHEMA awp_shard FROM PUBLIC;",
        composite_types_sql(conn),
    ]
    for f in functions:
        rule = "internal" if f.name.startswith("_") else RULES[f.name]
        if rule == "shard":
            continue
        shard_args = f"p_shard integer{', ' if f.identity_args else ''}{f.identity_args}"
        parts.append(_proxy(f"awp_shard.{f.name}", shard_args, f, "p_shard", 2))
        if f.name in ALL_FORMS:
            parts.append(_proxy(f"awp_shard.{f.name}_all", f.identity_args, f, "ALL", 1))
        kind, _, arg = rule.partition(":")
        if kind in ("run", "dispatch"):
            on = f"awp_router.shard_of(${_arg_index(f, arg)})"
        elif kind == "key":
            on = f"awp_router.shard_for_key(${_arg_index(f, arg)})"
        elif kind == "first":
            on = "0"
        elif kind == "all_union":
            on = "ALL"
        elif kind in ("all_first", "all_sum"):
            parts.append(_fan_out(f, "first" if kind == "all_first" else "sum"))
            continue
        else:  # custom, internal
            continue
        parts.append(_definer(_proxy(f"awp.{f.name}", f.args, f, on, 1)))
    return "\n\n".join(parts) + "\n"


GRANTS_SQL = """
DO $$
DECLARE
  f record;
BEGIN
  FOR f IN SELECT p.oid::regprocedure AS sig, n.nspname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
            WHERE n.nspname IN ('awp', 'awp_shard', 'awp_router') LOOP
    EXECUTE format('ALTER FUNCTION %s OWNER TO awp_owner', f.sig);
    EXECUTE format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', f.sig);
    IF f.nspname = 'awp' THEN
      EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO awp_gateway', f.sig);
    END IF;
  END LOOP;
END $$;
"""


def router_sql_dir(sql_dir: Path | None = None) -> Path:
    return (sql_dir or default_sql_dir()) / "router"


def _router_connstr(shard_admin_dsn: str, password: str) -> str:
    """The router's connection string to a shard: its host, port and database, as the router's login."""
    info = conninfo_to_dict(shard_admin_dsn)
    keep = {k: str(v) for k, v in info.items() if k in ("host", "hostaddr", "port", "dbname") and v}
    return make_conninfo(**keep, user=ROUTER_LOGIN, password=password)


def prepare_shard(shard_admin_dsn: str, index: int, password: str, sql_dir: Path | None = None) -> str:
    """Migrate the database at ``shard_admin_dsn`` (a superuser's), make it shard ``index`` and give the router its
    login there with ``password`` (one for every shard: two shards may share a cluster, whose roles are the
    cluster's); returns the router's connection string to it."""
    migrate(shard_admin_dsn, sql_dir)
    with psycopg.connect(shard_admin_dsn, autocommit=True) as conn:
        conn.execute("SELECT awp._set_shard_index(%s)", (index,))
        exists = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (ROUTER_LOGIN,)).fetchone()
        verb = sql.SQL("ALTER") if exists else sql.SQL("CREATE")
        conn.execute(
            sql.SQL("{} ROLE {} LOGIN PASSWORD {}").format(verb, sql.Identifier(ROUTER_LOGIN), sql.Literal(password))
        )
        conn.execute(sql.SQL("GRANT awp_router TO {}").format(sql.Identifier(ROUTER_LOGIN)))
        conn.execute(
            sql.SQL("ALTER ROLE {} SET lock_timeout = {}").format(
                sql.Identifier(ROUTER_LOGIN), sql.Literal(ROUTER_LOCK_TIMEOUT)
            )
        )
    return _router_connstr(shard_admin_dsn, password)


def install_router(router_admin_dsn: str, shard_conn_for_catalog: str, sql_dir: Path | None = None) -> None:
    """Apply the router's SQL to the database at ``router_admin_dsn`` (a superuser's), the proxies made from the
    catalog of the shard at ``shard_conn_for_catalog``."""
    folder = router_sql_dir(sql_dir)
    with psycopg.connect(shard_conn_for_catalog) as shard:
        generated = proxies_sql(shard)
    with psycopg.connect(router_admin_dsn) as conn, conn.transaction():
        conn.execute((folder / "00_router.sql").read_text())
        conn.execute(generated)
        conn.execute((folder / "20_wrappers.sql").read_text())
        conn.execute(GRANTS_SQL)


def init(router_admin_dsn: str, shard_admin_dsns: list[str], sql_dir: Path | None = None) -> list[str]:
    """Make shards 0..n-1 of the databases given and the router in front of them; returns the shards' connection
    strings as the router keeps them (with the router login's password)."""
    if not shard_admin_dsns:
        raise ValueError("a router needs at least one shard")
    password = secrets.token_urlsafe(24)
    connstrs = [prepare_shard(dsn, i, password, sql_dir) for i, dsn in enumerate(shard_admin_dsns)]
    install_router(router_admin_dsn, shard_admin_dsns[0], sql_dir)
    with psycopg.connect(router_admin_dsn) as conn, conn.transaction():
        conn.execute("DELETE FROM awp_router.shards")
        for i, connstr in enumerate(connstrs):
            conn.execute("INSERT INTO awp_router.shards (shard, connstr) VALUES (%s, %s)", (i, connstr))
    log.info("router ready with %d shards", len(connstrs))
    return connstrs


def add_shard(router_admin_dsn: str, shard_admin_dsn: str, sql_dir: Path | None = None) -> int:
    """Add the database at ``shard_admin_dsn`` as the next shard: it takes new runs from now on (existing runs stay
    where they are). Copies what every shard holds alike from shard 0 first: every workflow version in order, the
    settings, the rate limits, and the live worker sessions. Returns the new shard's number."""
    with psycopg.connect(router_admin_dsn) as conn:
        index, first = conn.execute(
            "SELECT count(*), min(connstr) FILTER (WHERE shard = 0) FROM awp_router.shards"
        ).fetchone()  # type: ignore[misc]
    password = conninfo_to_dict(first).get("password") or secrets.token_urlsafe(24)
    connstr = prepare_shard(shard_admin_dsn, index, str(password), sql_dir)
    with (
        psycopg.connect(router_admin_dsn, autocommit=True) as router,
        psycopg.connect(shard_admin_dsn, autocommit=True) as shard,
    ):
        versions = router.execute(
            "SELECT v.definition FROM awp.list_workflows(NULL, NULL) w,"
            " LATERAL generate_series(1, w.latest_version) n,"
            " LATERAL awp.get_workflow_version(w.workflow_id, n) v ORDER BY w.workflow_id, n"
        ).fetchall()
        for (definition,) in versions:
            shard.execute("SELECT * FROM awp.create_workflow_version(%s)", (Jsonb(definition),))
        settings = router.execute("SELECT awp.get_settings()").fetchone()[0]  # type: ignore[index]
        shard.execute(
            "SELECT awp.configure(" + ", ".join(f"{k} => %s" for k in settings) + ")", tuple(settings.values())
        )
        for name, max_in_flight, per_window, window_ms in router.execute(
            "SELECT name, max_in_flight, per_window, window_ms FROM awp.list_limits()"
        ).fetchall():
            shard.execute("SELECT * FROM awp.set_limit(%s, %s, %s, %s)", (name, max_in_flight, per_window, window_ms))
        router.execute("INSERT INTO awp_router.shards (shard, connstr) VALUES (%s, %s)", (index, connstr))
        workers = router.execute(
            "SELECT worker_id FROM awp.list_workers(NULL, NULL, NULL) WHERE status IN ('active', 'draining')"
        ).fetchall()
        for (worker_id,) in workers:
            router.execute("SELECT awp_router.adopt_worker(%s, %s)", (index, worker_id))
    log.info("shard %d added (%d workflow versions, %d workers copied)", index, len(versions), len(workers))
    return int(index)
