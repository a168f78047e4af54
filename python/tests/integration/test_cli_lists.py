"""The CLI lists of issue 41: ``awp run list``, ``awp workflow list / versions / show``, ``awp worker list``, against a
live gateway; their columns are never cut when stdout is not a terminal (no COLUMNS here: a pipe)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import psycopg
import yaml
from click.testing import CliRunner, Result

from awp.cli.main import main
from awp.dev.procs import awp_command
from awp_testing.gateway import ServeProcess


def awp(gw: ServeProcess, *args: str) -> Result:
    env = {"AWP_GATEWAY_URL": gw.base_url, "AWP_OPERATOR_TOKEN": gw.tokens.operator}
    return CliRunner().invoke(main, list(args), env=env, catch_exceptions=False)


def test_workflow_and_run_lists(gw: ServeProcess, db_dsn: str) -> None:
    wid = "lists-a-workflow-with-a-rather-long-name"
    first: dict[str, object] = {"id": wid, "tasks": [{"key": "a", "executor": "mock"}]}
    second = {
        **first,
        "tasks": [{"key": "a", "executor": "mock"}, {"key": "b", "executor": "mock", "depends_on": ["a"]}],
    }
    with psycopg.connect(db_dsn, autocommit=True) as c:
        for definition in (first, second):
            c.execute("SELECT * FROM awp.create_workflow_version(%s)", [json.dumps(definition)])
        runs = [c.execute("SELECT awp.start_run(%s)", [wid]).fetchone()[0] for _ in range(3)]  # type: ignore[index]
        c.execute("SELECT * FROM awp.register_worker('lists-worker', ARRAY['mock'], 2)")

    listed = awp(gw, "workflow", "list")
    assert listed.exit_code == 0, listed.output
    line = next(x for x in listed.output.splitlines() if x.startswith(wid))
    assert line.split()[1] == "2", "its latest version, the whole id shown"

    versions = awp(gw, "workflow", "versions", wid)
    assert [x.split()[:2] for x in versions.output.splitlines()[1:]] == [["1", "1"], ["2", "2"]], versions.output

    shown = awp(gw, "workflow", "show", wid)
    assert shown.output.startswith(f"# workflow {wid} version 2 (2 tasks)"), shown.output
    assert yaml.safe_load(shown.output) == second
    assert yaml.safe_load(awp(gw, "workflow", "show", wid, "--version", "1").output) == first
    missing = awp(gw, "workflow", "show", "lists-nope")
    assert missing.exit_code != 0 and "not_found" in missing.output

    run_list = awp(gw, "run", "list", "--workflow", wid, "--limit", "2")
    assert run_list.exit_code == 0, run_list.output
    rows = run_list.output.splitlines()
    assert rows[0].split() == ["run", "workflow", "status", "created", "finished", "tasks"]
    assert [r.split()[0] for r in rows[1:]] == runs[::-1][:2], "newest first, --limit 2, whole run ids"
    assert all(f"{wid} v2" in r and r.split()[3] in ("pending", "running") for r in rows[1:]), rows
    none = awp(gw, "run", "list", "--workflow", wid, "--status", "failed")
    assert none.output.strip() == f"no runs of workflow {wid} failed"

    workers = awp(gw, "worker", "list")
    assert workers.exit_code == 0 and "lists-worker" in workers.output, workers.output
    assert awp(gw, "worker", "list", "--json").output.count('"display_name": "lists-worker"') == 1


def test_a_worker_without_its_token_says_which_variable_to_set(gw: ServeProcess) -> None:
    bare = CliRunner().invoke(main, ["worker", "--executor", "mock"], env={"AWP_WORKER_BOOTSTRAP_TOKEN": ""})
    assert bare.exit_code == 2 and "set AWP_WORKER_BOOTSTRAP_TOKEN" in bare.output, bare.output


def test_cli_errors_name_the_fix(gw: ServeProcess, db_dsn: str, tmp_path: Path) -> None:
    """Issue 41: a gateway that is not there, a missing token, a port in use, a YAML key given twice."""
    down = CliRunner().invoke(main, ["run", "list"], env={"AWP_GATEWAY_URL": "http://127.0.0.1:9"})
    assert down.exit_code == 1 and "start it with `awp serve`" in down.output and "AWP_GATEWAY_URL" in down.output
    anonymous = CliRunner().invoke(
        main, ["run", "list"], env={"AWP_GATEWAY_URL": gw.base_url, "AWP_OPERATOR_TOKEN": ""}
    )
    assert anonymous.exit_code == 1 and "set AWP_OPERATOR_TOKEN" in anonymous.output, anonymous.output

    twice = tmp_path / "twice.yaml"
    twice.write_text("id: twice\nconcurrency: 2\nconcurrency: 3\ntasks: [{key: a, executor: mock}]\n")
    refused = awp(gw, "workflow", "apply", str(twice))
    assert refused.exit_code == 1 and "the key 'concurrency' is given twice" in refused.output, refused.output
    twice_json = tmp_path / "twice.json"
    twice_json.write_text('{"id": "twice", "id": "again", "tasks": [{"key": "a", "executor": "mock"}]}')
    assert "the key 'id' is given twice" in awp(gw, "workflow", "apply", str(twice_json)).output
    typo = tmp_path / "typo.yaml"
    typo.write_text("id: typo\nconcurency: 2\ntasks: [{key: a, executor: mock}]\n")
    hint = awp(gw, "workflow", "apply", str(typo))
    assert "invalid_request: unknown fields: concurency (did you mean concurrency?)" in hint.output, hint.output

    tokens = ["--viewer-token", "v" * 32, "--operator-token", "o" * 32, "--bootstrap-token", "b" * 32]
    busy = subprocess.run(
        awp_command("serve", "--port", str(gw.port), "--database-url", db_dsn, *tokens),
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if not k.startswith("AWP_")}
        | {"AWP_SQL_DIR": os.environ.get("AWP_SQL_DIR", "")},
    )
    assert busy.returncode == 1, busy.stderr
    assert f"another process listens on port {gw.port}" in busy.stderr and "Traceback" not in busy.stderr, busy.stderr


def test_a_failed_run_is_re_run_to_success(gw: ServeProcess, db_dsn: str) -> None:
    """Issue 41: ``awp run retry`` and ``POST /runs/{id}/retry`` (with an Idempotency-Key) on a failed run; a real
    worker runs the re-run to success, the succeeded task is not run again."""
    import httpx
    from worker_support import Workers, apply, start_run, task, tasks, wait_run

    definition = {
        "id": "lists-rerun",
        "tasks": [
            {"key": "first", "executor": "mock", "input": {"output": "kept"}},
            {"key": "flaky", "executor": "mock", "depends_on": ["first"], "input": {"fail_attempts": 1}},
            {"key": "last", "executor": "mock", "depends_on": ["flaky"], "input": {"echo": True}},
        ],
    }
    with Workers(gw) as ws:
        ws.start("rerun-w", concurrency=2)
        run_id = start_run(gw, apply(gw, definition))
        assert wait_run(gw, run_id)["status"] == "failed"
        assert {k: t["status"] for k, t in tasks(gw, run_id).items()} == {
            "first": "succeeded",
            "flaky": "failed",
            "last": "skipped",
        }
        again = awp(gw, "run", "retry", run_id)
        assert again.exit_code == 0 and "2 task(s) to run (flaky, last)" in again.output, again.output
        run = wait_run(gw, run_id)
        assert run["status"] == "succeeded"
        assert len(task(gw, run_id, "first")["attempt_history"]) == 1, "the succeeded task ran once"
        assert [a["status"] for a in task(gw, run_id, "flaky")["attempt_history"]] == ["failed", "succeeded"]
        assert run["output"]["last"]["upstream"] == {"flaky": {"task": "flaky", "action": "flaky", "attempt": 2}}
        refused = awp(gw, "run", "retry", run_id)
        assert refused.exit_code == 1 and "only a failed or canceled run can be re-run" in refused.output

        run2 = start_run(gw, apply(gw, definition))
        assert wait_run(gw, run2)["status"] == "failed"
        headers = {**gw.auth("operator"), "Idempotency-Key": f"rerun-{run2}"}
        body = {"task_keys": ["flaky"]}
        first = httpx.post(gw.api(f"/runs/{run2}/retry"), json=body, headers=headers, timeout=10)
        assert first.status_code == 200 and first.json()["task_keys"] == ["flaky", "last"], first.text
        replay = httpx.post(gw.api(f"/runs/{run2}/retry"), json=body, headers=headers, timeout=10)
        assert replay.status_code == 200 and replay.json() == first.json()
        assert wait_run(gw, run2)["status"] == "succeeded"
