"""The people-facing CLI (``awp workflow|run|workers``) against a live gateway and a real worker."""

from __future__ import annotations

import json
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from click.testing import CliRunner, Result
from worker_support import Workers, mock_task, wait_run

from awp.cli.main import main
from awp_testing.gateway import ServeProcess

GATEWAY_SETTINGS = {"lease_duration_ms": 2000, "heartbeat_interval_ms": 200}


def write_definition(tmp_path: Path, definition: dict, suffix: str = ".yaml") -> Path:
    path = tmp_path / f"wf{suffix}"
    path.write_text(yaml.safe_dump(definition) if suffix == ".yaml" else json.dumps(definition))
    return path


def test_workflow_apply_yaml_and_json_is_idempotent(awp: Callable[..., Result], tmp_path: Path) -> None:
    definition: dict[str, Any] = {"id": "cli-apply", "tasks": [mock_task("a")]}
    first = awp("workflow", "apply", str(write_definition(tmp_path, definition)))
    assert "workflow cli-apply version 1" in first.output
    again = awp("workflow", "apply", "--json", str(write_definition(tmp_path, definition, ".json")))
    assert json.loads(again.output) == {"workflow_id": "cli-apply", "version": 1}
    definition["tasks"].append(mock_task("b", ["a"]))
    assert "version 2" in awp("workflow", "apply", str(write_definition(tmp_path, definition))).output


def test_invalid_definition_is_a_clear_error(awp: Callable[..., Result], tmp_path: Path) -> None:
    bad = write_definition(tmp_path, {"id": "cli-bad", "tasks": [mock_task("a", ["missing"])]})
    result = awp("workflow", "apply", str(bad), ok=False)
    assert result.exit_code == 1
    assert "invalid_request" in result.output


def test_run_start_wait_show_events_watch_and_workers(
    awp: Callable[..., Result], gw: ServeProcess, tmp_path: Path
) -> None:
    definition = {
        "id": "cli-run",
        "tasks": [mock_task("a", sleep_ms=100), mock_task("b", ["a"], max_attempts=2, fail_attempts=1)],
    }
    awp("workflow", "apply", str(write_definition(tmp_path, definition)))
    with Workers(gw) as ws:
        w = ws.start("cli-worker")
        started = awp("run", "start", "cli-run", "--wait", "--json")
        answer = json.loads(started.output)
        run_id = answer["run_id"]
        assert answer["final_status"] == "succeeded"

        workers = json.loads(awp("workers", "--json").output)
        assert any(x["display_name"] == "cli-worker" and x["status"] == "active" for x in workers)
        assert "cli-worker" in awp("workers").output

        w.signal(signal.SIGTERM)
        assert w.wait_exit(10) == 0

    shown = json.loads(awp("run", "show", run_id, "--json").output)
    assert shown["run"]["status"] == "succeeded"
    assert {t["task_key"]: t["attempts"] for t in shown["tasks"]} == {"a": 1, "b": 2}
    text = awp("run", "show", run_id).output
    assert "succeeded" in text and "b" in text

    events = json.loads(awp("run", "events", run_id, "--json").output)
    assert [e["sequence"] for e in events] == list(range(1, len(events) + 1))
    assert events[-1]["to_status"] == "succeeded"
    assert "waiting_retry" in awp("run", "events", run_id).output

    watched = awp("run", "watch", run_id)
    assert "succeeded" in watched.output and "attempts" in watched.output


def test_run_start_by_version_and_cancel(awp: Callable[..., Result], gw: ServeProcess, tmp_path: Path) -> None:
    awp("workflow", "apply", str(write_definition(tmp_path, {"id": "cli-cancel", "tasks": [mock_task("x")]})))
    started = awp("run", "start", "cli-cancel", "--version", "1")
    run_id = started.output.split()[1]
    assert run_id.startswith("run")
    canceled = awp("run", "cancel", run_id)
    assert "cancel requested" in canceled.output
    assert wait_run(gw, run_id, timeout=10)["status"] == "canceled"
    watched = awp("run", "watch", run_id, ok=False)
    assert watched.exit_code == 1 and "canceled" in watched.output


def test_run_show_explains_failed_tasks(awp: Callable[..., Result], gw: ServeProcess, tmp_path: Path) -> None:
    definition = {"id": "cli-fail", "tasks": [mock_task("boom", fail="permanent"), mock_task("after", ["boom"])]}
    awp("workflow", "apply", str(write_definition(tmp_path, definition)))
    with Workers(gw) as ws:
        ws.start("cli-fail-worker")
        result = awp("run", "start", "cli-fail", "--wait", ok=False)
        assert result.exit_code == 1
    run_id = result.output.split()[1]
    shown = awp("run", "show", run_id).output
    assert "boom failed: attempt 1 failed, mock_permanent: mock task failed (permanent)" in shown
    assert "skipped" in shown


def test_unknown_run_and_wrong_token_are_clear_errors(awp: Callable[..., Result], gw: ServeProcess) -> None:
    missing = awp("run", "show", "run_nope", ok=False)
    assert missing.exit_code == 1 and "not_found" in missing.output
    runner = CliRunner()
    result = runner.invoke(main, ["workers", "--gateway", gw.base_url, "--token", "wrong"])
    assert result.exit_code == 1 and "unauthorized" in result.output


def test_serve_refuses_more_group_lanes_than_connections() -> None:
    """--group-lanes above --pool-size is a usage error named after the option, before anything starts."""
    tokens = ["--viewer-token", "v" * 32, "--operator-token", "o" * 32, "--bootstrap-token", "b" * 32]
    args = ["serve", "--database-url", "postgresql://nowhere.invalid/x", *tokens, "--pool-size", "4"]
    result = CliRunner().invoke(main, [*args, "--group-lanes", "5"])
    assert result.exit_code == 2, result.output
    assert "--group-lanes" in result.output and "at most --pool-size" in result.output
