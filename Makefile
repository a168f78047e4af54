# AWP — every target is one line of intent; `make help` lists them.
SHELL   := /bin/bash
PYTHON  ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.awp-setup.stamp
BENCH_STAMP := $(VENV)/.awp-bench.stamp
SUDO    := $(if $(filter 0,$(shell id -u)),,sudo)

.DEFAULT_GOAL := help
.PHONY: help setup pgtap plpgsql-check chromium ha-deps valgrind pgbouncer plproxy shard-test pgbouncer-test test test-db test-py ha-test demo demo-dynamic bench bench-quick chaos soak fuzz mutate docs lint typecheck test-fast clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/:.*## /\t/' | expand -t 14

setup: $(STAMP) pgtap plpgsql-check chromium ha-deps valgrind pgbouncer plproxy  ## venv + Python packages + pgTAP/pg_prove + plpgsql_check + Chromium (UI tests) + Patroni/etcd (HA test) + valgrind (benchmarks/instructions.py) + PgBouncer + PL/Proxy (shards), idempotent

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	touch $@

pgtap:  ## install pgTAP and pg_prove with apt-get, only when missing
	@if command -v pg_prove >/dev/null && ls /usr/share/postgresql/*/extension/pgtap.control >/dev/null 2>&1; then exit 0; fi; \
	major=$$(ls /usr/lib/postgresql 2>/dev/null | sort -V | tail -n1); \
	if [ -z "$$major" ]; then echo "PostgreSQL is not installed: apt-get install -y postgresql-15 (or postgresql)" >&2; exit 1; fi; \
	echo "installing pgTAP for PostgreSQL $$major and pg_prove"; \
	$(SUDO) apt-get update -qq && \
	$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
		postgresql-$$major-pgtap libtap-parser-sourcehandler-pgtap-perl

plpgsql-check:  ## install the plpgsql_check extension (static check of every PL/pgSQL function, a pytest) with apt-get, only when missing
	@if ls /usr/share/postgresql/*/extension/plpgsql_check.control >/dev/null 2>&1; then exit 0; fi; \
	major=$$(ls /usr/lib/postgresql 2>/dev/null | sort -V | tail -n1); \
	if [ -z "$$major" ]; then echo "PostgreSQL is not installed: apt-get install -y postgresql-15 (or postgresql)" >&2; exit 1; fi; \
	echo "installing plpgsql_check for PostgreSQL $$major"; \
	$(SUDO) apt-get update -qq && \
	$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql-$$major-plpgsql-check

chromium:  ## install Debian's chromium (the dashboard's browser tests drive it) with apt-get, only when missing
	@if command -v chromium >/dev/null; then exit 0; fi; \
	echo "installing chromium"; \
	$(SUDO) apt-get update -qq && \
	$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium

ha-deps:  ## install Debian's patroni and etcd-server (the HA test runs them) with apt-get, only when missing
	@if command -v patroni >/dev/null && command -v etcd >/dev/null; then exit 0; fi; \
	echo "installing patroni and etcd-server"; \
	$(SUDO) apt-get update -qq && \
	$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends patroni etcd-server

pgbouncer:  ## install Debian's pgbouncer (python/tests/integration/test_pgbouncer.py, make pgbouncer-test) with apt-get, only when missing
	@if command -v pgbouncer >/dev/null || test -x /usr/sbin/pgbouncer; then exit 0; fi; \
	echo "installing pgbouncer"; \
	$(SUDO) apt-get update -qq && \
	$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends pgbouncer

plproxy:  ## install Debian's PL/Proxy for the server's major version (the router of docs/scale-out.md; make shard-test) with apt-get, only when missing
	@if ls /usr/share/postgresql/*/extension/plproxy.control >/dev/null 2>&1; then exit 0; fi; \
	major=$$(ls /usr/lib/postgresql 2>/dev/null | sort -V | tail -n1); \
	if [ -z "$$major" ]; then echo "PostgreSQL is not installed: apt-get install -y postgresql-15 (or postgresql)" >&2; exit 1; fi; \
	echo "installing PL/Proxy for PostgreSQL $$major"; \
	$(SUDO) apt-get update -qq && \
	$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql-$$major-plproxy

valgrind:  ## install valgrind (benchmarks/instructions.py counts instructions under callgrind) with apt-get, only when missing
	@if command -v valgrind >/dev/null; then exit 0; fi; \
	echo "installing valgrind"; \
	$(SUDO) apt-get update -qq && \
	$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends valgrind

test: test-db test-py  ## every test: pgTAP, then pytest

test-db: setup  ## pgTAP tests (db/tests) with pg_prove on a throwaway cluster and a fresh migrated database
	$(BIN)/python -m awp_testing pgprove db/tests

test-py: setup  ## pytest against a throwaway cluster (or AWP_TEST_DSN)
	$(BIN)/pytest python/tests

PGBOUNCER_SUITE := test_gateway_api.py test_gateway_contract.py test_worker_runtime.py test_data_flow.py test_batch_completions.py \
	test_start_runs.py test_dynamic.py test_signals.py test_drain.py test_routing.py test_progress.py \
	test_worker_results.py test_rate_limits.py test_pgbouncer.py
pgbouncer-test: setup  ## the HTTP and worker end-to-end suite with every gateway's requests through PgBouncer (transaction pooling)
	AWP_TEST_PGBOUNCER=1 $(BIN)/pytest -p no:cacheprovider $(addprefix python/tests/integration/,$(PGBOUNCER_SUITE))

test-fast: test-db  ## pgTAP, then pytest without the tests marked slow (fault, chaos, soak, HA, mutation, races)
	$(BIN)/pytest -m "not slow" python/tests

shard-test: setup  ## 200 runs over 2 shard clusters behind a PL/Proxy router, kill -9 of a worker and the gateway; last line: shards: 2 runs 200 succeeded 200 lost 0 violations 0
	@summary=$$(mktemp); rc=0; \
	AWP_SHARD_RUNS=$${AWP_SHARD_RUNS:-200} AWP_SHARD_SUMMARY=$$summary $(BIN)/pytest -q -s -p no:cacheprovider \
	  python/tests/faults/test_shards.py::test_runs_over_two_shards_survive_kills_of_a_worker_and_the_gateway || rc=$$?; \
	cat $$summary; rm -f $$summary; exit $$rc

ha-test: $(STAMP) ha-deps  ## PostgreSQL failover + switchover under Patroni mid-run; prints one summary line (~1 min)
	$(BIN)/pytest -q -s -p no:cacheprovider python/tests/faults/test_ha_patroni.py::test_patroni_failover_and_switchover_lose_nothing

demo: setup  ## start the local database, control plane and workers, and run a sample workflow
	$(BIN)/awp demo

demo-dynamic: setup  ## the same with the dynamic example: for_each over chunks made at run time, when, a child run
	$(BIN)/awp demo --dynamic

$(BENCH_STAMP): $(STAMP)
	$(BIN)/pip install -q -e '.[bench]' && touch $@

bench: setup $(BENCH_STAMP)  ## full benchmark (about 25 min: step 9, many runs, adds about 7; step 10, for_each, about 2; step 11, rate limits, about 1; step 12, live output, about 3; step 13, through a PL/Proxy router, about 4); results, table and chart go to benchmarks/results/
	$(BIN)/python benchmarks/run.py

bench-quick: setup $(BENCH_STAMP)  ## a reduced benchmark (about 3 min), for a smoke test
	$(BIN)/python benchmarks/run.py --quick

chaos: setup  ## kill workers and the control plane while runs progress; check every run finishes correctly
	AWP_CHAOS_SECONDS=$${AWP_CHAOS_SECONDS:-60} $(BIN)/pytest -s python/tests/faults/test_chaos.py

soak: setup  ## retention soak (4 min): many small runs, short retention; prints table sizes over time (docs/retention.md)
	AWP_SOAK_SECONDS=$${AWP_SOAK_SECONDS:-240} $(BIN)/pytest -s python/tests/faults/test_soak.py

fuzz: setup  ## hostile-input fuzzing (a few minutes): schemathesis, 200 examples per operation, all checks; 10,000 raw-byte requests
	AWP_FUZZ_EXAMPLES=$${AWP_FUZZ_EXAMPLES:-200} $(BIN)/pytest -q -s -p no:cacheprovider python/tests/integration/test_gateway_fuzz.py python/tests/integration/test_raw_fuzz.py

mutate: setup  ## mutation testing (a few minutes): every mutant of db/mutations/mutations.yaml must fail pgTAP (or its race tests)
	$(BIN)/python -m awp_testing.mutate $(MUTATE_ARGS)

docs: setup  ## regenerate docs/sql-api.md from a migrated database's catalog (python -m awp_testing.sqldoc)
	$(BIN)/python -m awp_testing.sqldoc > docs/sql-api.md.tmp && mv docs/sql-api.md.tmp docs/sql-api.md

lint: setup  ## ruff
	$(BIN)/ruff check python $(wildcard benchmarks)
	$(BIN)/ruff format --check python $(wildcard benchmarks)

typecheck: setup $(BENCH_STAMP)  ## mypy on python/awp, python/awp_testing, python/tests and benchmarks ([tool.mypy] in pyproject.toml)
	$(BIN)/mypy

clean:  ## remove the venv and caches (the local cluster in .awp/ is kept: awp db down --purge)
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache python/*.egg-info
	find python benchmarks -name __pycache__ -type d -prune -exec rm -rf {} + 2>/dev/null || true
