"""Mutation testing of ``db/functions``: does the test suite notice when one rule of the SQL is broken?

``db/mutations/mutations.yaml`` lists single-rule mutations (a comparison flipped, a guard dropped, a lock
order swapped, a limit off by one, an event or a revision bump left out, ...). For each one this runner

1. copies ``db/`` to a temporary directory (the working tree is never modified) and replaces the exact
   snippet ``find`` (which must occur exactly once in its file: the list fails loudly when it drifts
   from the code) by ``replace``;
2. clones a database migrated once from the unmutated ``db/`` (``CREATE DATABASE ... TEMPLATE``), and
   re-applies the mutated function files to it (``awp.dev.migrate``);
3. runs the pgTAP files against it, the ones the mutation names in ``tests`` first, stopping at the
   first file that fails (the mutant is then *killed*);
4. when pgTAP let it live and the mutation names pytest node ids (``pytest``: race tests and the like),
   runs those against the same server with ``AWP_SQL_DIR`` pointing at the mutated copy.

A mutant that survives both is reported as a *survivor*, unless the list marks it ``equivalent`` with
the reason no test can tell it from the original. Everything runs on one throwaway cluster (or
``AWP_TEST_DSN``'s server); the unmutated copy must pass first (the baseline), or nothing is scored.

    python -m awp_testing.mutate                      # every mutation, 2 at a time; exit 1 on any survivor
    python -m awp_testing.mutate --check              # only verify that every snippet is found exactly once
    python -m awp_testing.mutate --sample 4 --seed 7  # a random sample (CI); --only NAME ... for chosen ones
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import dataclasses
import logging
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psycopg
import yaml
from psycopg import sql

from awp.dev.localdb import Server
from awp.dev.migrate import default_sql_dir, migrate
from awp.dev.pgbin import pg_bin
from awp_testing.cluster import database_name, fresh_database, libpq_env, throwaway_cluster

log = logging.getLogger("awp_testing.mutate")

REPO = Path(__file__).resolve().parent.parent.parent
DEFAULT_LIST = REPO / "db" / "mutations" / "mutations.yaml"
NAME = re.compile(r"^[a-z0-9_]+$")
PSQL_FLAGS = ["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-P", "pager=off"]


@dataclasses.dataclass(frozen=True)
class Mutation:
    name: str
    file: str  # relative to db/functions
    find: str
    replace: str
    tests: tuple[str, ...] = ()  # pgTAP files (names in db/tests) to run first
    pytest: tuple[str, ...] = ()  # pytest node ids (relative to the repository) run when pgTAP passes
    equivalent: str | None = None  # why no test can tell this mutant from the original
    why: str = ""  # what the mutation breaks, in a few words


@dataclasses.dataclass
class Outcome:
    mutation: Mutation
    status: str  # killed | survived | error
    by: str = ""  # the pgTAP file or "pytest ..." that failed, or the error
    seconds: float = 0.0


def load(path: Path = DEFAULT_LIST) -> list[Mutation]:
    """The mutations of ``path`` (a YAML list of mappings); raises ValueError on a malformed entry."""
    data = yaml.safe_load(path.read_text())
    if not isinstance(data, list):
        raise ValueError(f"{path}: expected a list of mutations")
    known = {f.name for f in dataclasses.fields(Mutation)}
    out: list[Mutation] = []
    for i, item in enumerate(data):
        if not isinstance(item, dict) or not {"name", "file", "find", "replace"} <= item.keys():
            raise ValueError(f"{path}: entry {i} needs name, file, find and replace")
        extra = set(item) - known
        if extra:
            raise ValueError(f"{path}: entry {item['name']!r} has unknown keys {sorted(extra)}")
        for key in ("tests", "pytest"):
            if isinstance(item.get(key), str):
                item[key] = [item[key]]
            item[key] = tuple(item.get(key) or ())
        out.append(Mutation(**item))
    return out


def problems(mutations: list[Mutation], sql_dir: Path) -> list[str]:
    """Every way the list is out of step with the code (empty when all is well)."""
    found: list[str] = []
    names: set[str] = set()
    tests = {p.name for p in (sql_dir / "tests").glob("*.sql")}
    for m in mutations:
        where = f"mutation {m.name!r}"
        if not NAME.match(m.name):
            found.append(f"{where}: names are lower-case words joined by _")
        if m.name in names:
            found.append(f"{where}: the name is used twice")
        names.add(m.name)
        path = sql_dir / "functions" / m.file
        if "/" in m.file or not path.is_file():
            found.append(f"{where}: no file db/functions/{m.file}")
            continue
        n = path.read_text().count(m.find)
        if n != 1:
            found.append(f"{where}: its snippet occurs {n} times in db/functions/{m.file} (must be exactly once)")
        if m.find == m.replace:
            found.append(f"{where}: replace equals find")
        found.extend(f"{where}: no pgTAP file {t}" for t in m.tests if t not in tests)
        found.extend(f"{where}: no pytest file {p}" for p in m.pytest if not (REPO / p.split("::")[0]).is_file())
    return found


def mutated_copy(sql_dir: Path, m: Mutation | None, dest: Path) -> Path:
    """``sql_dir`` copied to ``dest/db`` with ``m`` applied (None: unmutated); returns the copy."""
    copy = dest / "db"
    shutil.copytree(sql_dir, copy, ignore=shutil.ignore_patterns("mutations", "__pycache__"))
    if m is not None:
        path = copy / "functions" / m.file
        text = path.read_text()
        if text.count(m.find) != 1:
            raise ValueError(f"mutation {m.name!r}: snippet not found exactly once in {m.file}")
        path.write_text(text.replace(m.find, m.replace))
    return copy


def run_pgtap_file(dsn: str, path: Path) -> tuple[bool, str]:
    """Run one pgTAP file with psql as pg_prove does; (passed, a short reason when not)."""
    env = {**os.environ, **libpq_env(dsn)}
    try:
        res = subprocess.run(
            [pg_bin("psql"), *PSQL_FLAGS, "-f", str(path)], env=env, capture_output=True, text=True, timeout=300
        )
    except subprocess.TimeoutExpired:
        return False, "timed out after 300 s"
    lines = res.stdout.splitlines()
    plan = next((int(x[3:]) for x in lines if re.fullmatch(r"1\.\.\d+", x)), None)
    oks = [x for x in lines if re.match(r"ok \d+", x)]
    failed = [x for x in lines if re.match(r"not ok \d+", x) and "# TODO" not in x]
    if res.returncode != 0:
        return False, f"psql exit {res.returncode}: {(res.stderr.strip().splitlines() or [''])[-1][:200]}"
    if failed:
        return False, failed[0][:200]
    if plan is None or len(oks) != plan:
        return False, f"planned {plan}, ran {len(oks)}"
    return True, ""


def run_pytest(server_dsn: str, sql_copy: Path, nodes: tuple[str, ...]) -> tuple[bool, str]:
    """Run pytest ``nodes`` on ``server_dsn``'s server with databases migrated from ``sql_copy``."""
    env = {**os.environ, "AWP_TEST_DSN": server_dsn, "AWP_SQL_DIR": str(sql_copy)}
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "--no-header", *nodes]
    try:
        res = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired:
        return False, "pytest timed out after 600 s"
    if res.returncode == 0:
        return True, ""
    tail = [x for x in res.stdout.splitlines() if x.startswith(("FAILED", "ERROR"))] or res.stdout.splitlines()[-1:]
    return False, (tail[0] if tail else f"exit {res.returncode}")[:200]


class Runner:
    def __init__(self, server: Server, sql_dir: Path, template: str, use_pytest: bool = True) -> None:
        self.server = server
        self.sql_dir = sql_dir
        self.template = template
        self.use_pytest = use_pytest
        self.test_files = sorted((sql_dir / "tests").glob("*.sql"))

    def clone(self, name: str) -> str:
        with psycopg.connect(self.server.admin_dsn(), autocommit=True) as c:
            c.execute(
                sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(sql.Identifier(name), sql.Identifier(self.template))
            )
            # CREATE DATABASE copies the template's contents, not its own privileges (migration 0007 revokes
            # CONNECT from PUBLIC on the migrated database): give the copy the template's, as migrating would.
            c.execute(
                "UPDATE pg_catalog.pg_database SET datacl = (SELECT datacl FROM pg_catalog.pg_database"
                " WHERE datname = %s) WHERE datname = %s",
                [self.template, name],
            )
        return self.server.dsn(name)

    def run(self, m: Mutation | None, pytest_nodes: tuple[str, ...] = ()) -> Outcome:
        """Apply ``m`` (None: the baseline) to a copy and run the tests; killed when any of them fails."""
        started = time.monotonic()
        label = m or Mutation("baseline", "", "", "", pytest=pytest_nodes)
        outcome = Outcome(label, "survived")
        name = database_name("mut_" + label.name)
        with tempfile.TemporaryDirectory(prefix="awp-mutant-") as tmp:
            try:
                copy = mutated_copy(self.sql_dir, m, Path(tmp))
                dsn = self.clone(name)
                try:
                    try:
                        migrate(dsn, sql_dir=copy, with_pgtap=True)
                    except Exception as e:  # a mutant must still be valid SQL: that is an error of the list
                        outcome.status, outcome.by = "error", f"does not migrate: {str(e).splitlines()[0][:200]}"
                        return outcome
                    first = [copy / "tests" / t for t in label.tests]
                    order = first + [copy / "tests" / p.name for p in self.test_files if p.name not in label.tests]
                    for path in order:
                        ok, why = run_pgtap_file(dsn, path)
                        if not ok:
                            outcome.status, outcome.by = "killed", f"{path.name}: {why}"
                            return outcome
                finally:
                    self.server.drop_database(name)
                nodes = label.pytest if self.use_pytest else ()
                if nodes:
                    ok, why = run_pytest(self.server.dsn("postgres"), copy, nodes)
                    if not ok:
                        outcome.status, outcome.by = "killed", f"pytest: {why}"
            except Exception as e:
                outcome.status, outcome.by = "error", f"{type(e).__name__}: {e}"
            finally:
                outcome.seconds = time.monotonic() - started
        return outcome


def make_template(server: Server, sql_dir: Path) -> str:
    """The name of a database migrated from ``sql_dir`` with pgTAP, which every mutant's database clones."""
    name = database_name("mut_template")
    fresh_database(server, name, with_pgtap=True, sql_dir=sql_dir)
    return name


def score_line(outcomes: list[Outcome]) -> str:
    killed = sum(o.status == "killed" for o in outcomes)
    equivalent = sum(o.status == "survived" and o.mutation.equivalent is not None for o in outcomes)
    total = len(outcomes)
    scored = total - equivalent
    pct = 100.0 * killed / scored if scored else 100.0
    return (
        f"mutation score: {killed}/{scored} killed ({pct:.1f}%)"
        + (f"; {equivalent} equivalent survivor(s) not scored" if equivalent else "")
        + f"; {total} mutation(s) run"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m awp_testing.mutate", description=__doc__.split("\n\n")[0])
    parser.add_argument("--list", type=Path, default=DEFAULT_LIST, help="the mutations (YAML)")
    parser.add_argument("--sql-dir", type=Path, default=None, help="the db/ directory to copy (default: the repo's)")
    parser.add_argument("--check", action="store_true", help="only check that every snippet is found exactly once")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="run only these mutations")
    parser.add_argument("--sample", type=int, default=0, metavar="N", help="run N mutations chosen at random")
    parser.add_argument("--seed", type=int, default=None, help="seed of --sample (printed when not given)")
    parser.add_argument("--jobs", "-j", type=int, default=2, help="mutants tested at once (default 2)")
    parser.add_argument("--no-pytest", action="store_true", help="pgTAP only (skip the named pytest tests)")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(message)s")

    sql_dir = (args.sql_dir or default_sql_dir()).resolve()
    mutations = load(args.list)
    bad = problems(mutations, sql_dir)
    if bad:
        print(f"{args.list}: {len(bad)} problem(s):\n  " + "\n  ".join(bad), file=sys.stderr)
        return 2
    if args.check:
        print(f"{len(mutations)} mutations, every snippet found exactly once")
        return 0
    if args.only:
        unknown = set(args.only) - {m.name for m in mutations}
        if unknown:
            print(f"unknown mutation(s): {', '.join(sorted(unknown))}", file=sys.stderr)
            return 2
        mutations = [m for m in mutations if m.name in args.only]
    if args.sample:
        seed = args.seed if args.seed is not None else random.randrange(1 << 30)
        print(f"sample of {args.sample} (--seed {seed})")
        candidates = [m for m in mutations if m.equivalent is None]
        mutations = random.Random(seed).sample(candidates, min(args.sample, len(candidates)))

    started = time.monotonic()
    lock = threading.Lock()
    outcomes: list[Outcome] = []
    # One snapshot of db/ for the template and every mutant: edits made meanwhile do not mix in.
    with tempfile.TemporaryDirectory(prefix="awp-mutate-") as snap, throwaway_cluster() as server:
        sql_dir = mutated_copy(sql_dir, None, Path(snap))
        template = make_template(server, sql_dir)
        try:
            runner = Runner(server, sql_dir, template, use_pytest=not args.no_pytest)
            nodes = tuple(dict.fromkeys(n for m in mutations for n in m.pytest)) if not args.no_pytest else ()
            base = runner.run(None, nodes)
            if base.status != "survived":
                print(f"baseline (no mutation) fails: {base.by}\nfix the tests first", file=sys.stderr)
                return 2
            print(f"baseline passes ({len(runner.test_files)} pgTAP files, {len(nodes)} pytest node(s), "
                  f"{base.seconds:.1f}s); {len(mutations)} mutation(s), {args.jobs} at a time")  # fmt: skip

            def one(m: Mutation) -> Outcome:
                o = runner.run(m)
                with lock:
                    outcomes.append(o)
                    tag = "equivalent" if o.status == "survived" and m.equivalent else o.status
                    print(f"{tag:10} {m.name:44} {o.seconds:5.1f}s  {o.by}", flush=True)
                return o

            with concurrent.futures.ThreadPoolExecutor(max(1, args.jobs)) as pool:
                list(pool.map(one, mutations))
        finally:
            with contextlib.suppress(Exception):
                server.drop_database(template)

    order = {m.name: i for i, m in enumerate(mutations)}
    outcomes.sort(key=lambda o: order[o.mutation.name])
    survivors = [o for o in outcomes if o.status == "survived" and o.mutation.equivalent is None]
    equivalent = [o for o in outcomes if o.status == "survived" and o.mutation.equivalent is not None]
    errors = [o for o in outcomes if o.status == "error"]
    stale = [o for o in outcomes if o.status == "killed" and o.mutation.equivalent is not None]
    print()
    for o in stale:
        print(f"note       {o.mutation.name} is marked equivalent but was killed: remove its 'equivalent'")
    for o in equivalent:
        print(f"equivalent {o.mutation.name}: {o.mutation.equivalent}")
    for o in survivors:
        print(f"SURVIVED   {o.mutation.name} ({o.mutation.file}): {o.mutation.why}")
    for o in errors:
        print(f"ERROR      {o.mutation.name}: {o.by}")
    print(f"{score_line(outcomes)} in {time.monotonic() - started:.0f}s")
    return 1 if survivors or errors else 0


if __name__ == "__main__":
    sys.exit(main())
