"""The test machinery itself: a pgTAP run that finds no test file fails, and the live invariant sampler fails
when it checked nothing or when the checker raised an SQL error (only connection errors are tolerated)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from fault_support import InvariantSampler

from awp.dev.localdb import Server
from awp_testing.cluster import database_name, run_pg_prove
from awp_testing.gateway import wait_until


@pytest.mark.parametrize("layout", ["empty", "only-an-include", "not-a-test-file", "missing"])
def test_pgprove_fails_when_it_finds_no_test_file(tmp_path: Path, layout: str) -> None:
    target = tmp_path / "tests"
    if layout != "missing":
        target.mkdir()
    if layout == "only-an-include":
        (target / "_fixtures.sql.inc").write_text("SELECT 1;\n")
    if layout == "not-a-test-file":
        target = target / "notes.txt"
        target.write_text("not SQL\n")
    assert run_pg_prove(target) == 1
    # ... and so does the command `make test-db` runs.
    cmd = [sys.executable, "-m", "awp_testing", "pgprove", str(target)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert res.returncode == 1, res.stderr
    assert "no pgTAP test files" in res.stderr


def test_sampler_that_took_no_sample_fails() -> None:
    sampler = InvariantSampler("postgresql://postgres@127.0.0.1:1/nowhere", interval=0.01)
    with sampler:
        wait_until(lambda: sampler.errors >= 2, 10, 0.01, "connection errors")
        with pytest.raises(AssertionError, match="took no sample"):
            sampler.stop()
    assert sampler.samples == 0


def test_sampler_fails_on_an_sql_error(pg_cluster: Server) -> None:
    name = database_name("no_awp_schema")
    dsn = pg_cluster.create_database(name)  # no schema awp: check_invariants() does not exist
    try:
        sampler = InvariantSampler(dsn, interval=0.01)
        with sampler:
            wait_until(lambda: sampler.sql_errors, 10, 0.01, "an SQL error")
            with pytest.raises(AssertionError, match="check_invariants"):
                sampler.stop()
        assert sampler.errors == 0, "an SQL error is not counted as a connection error"
    finally:
        pg_cluster.drop_database(name)


def test_sampler_counts_its_samples(db_dsn: str) -> None:
    with InvariantSampler(db_dsn, interval=0.01) as sampler:
        wait_until(lambda: sampler.samples >= 3, 10, 0.01, "three samples")
        assert sampler.stop() == []
    assert sampler.sql_errors == []
