"""``awp run task``, ``awp run start --input/--input-file/--timeout`` and the small CLI fixes of issue 10
(a cycle reported once, cancel of a finished run, the real duration in ``awp run watch``, the demo's workflow
and ``examples/demo-etl.yaml`` agreeing), against a live gateway and real workers."""

from __future__ import annotations

import json
import re
import signal
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import pytest
import yaml
from click.testing import Result
from worker_support import Workers, api, get_run, mock_task, wait_run

from awp.cli.demo import FAST, NORMAL, _prepare_definition, examples_dir
from awp.cli.runs import EXIT_WAIT_TIMEOUT
from awp.cli.terminal import cancel_message, run_duration_s
from awp.server.errors import join_message
from awp_testing.gateway import ServeProcess

WIDTH = 80
GATEWAY_SETTINGS = {"lease_duration_ms": 2000, "heartbeat_interval_ms": 200}
CLI_ENV = {"COLUMNS": str(WIDTH)}


def apply_file(awp: Callable[..., Result], tmp_path: Path, definition: dict) -> Result:
    path = tmp_path / f"{definition['id']}.yaml"
    path.write_text(yaml.safe_dump(definition))
    return awp("workflow", "apply", str(path))


def no_traceback(result: Result) -> None:
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


# ---- awp run task ----------------------------------------------------------------------------------------------


def test_run_task_prints_the_attempt_history(awp: Callable[..., Result], gw: ServeProcess, tmp_path: Path) -> None:
    long_output = {"rows": list(range(200)), "note": "x" * 300}
    definition = {
        "id": "cli-task",
        "tasks": [
            mock_task("extract", sleep_ms=200, output={"n": 1}),
            mock_task("load", ["extract"], max_attempts=3, fail_attempts=1, output=long_output),
        ],
    }
    apply_file(awp, tmp_path, definition)
    with Workers(gw) as ws:
        ws.start("cli-task-worker")
        run_id = json.loads(awp("run", "start", "cli-task", "--wait", "--json").output)["run_id"]

    raw = json.loads(awp("run", "task", run_id, "load", "--json").output)
    assert raw["task_key"] == "load" and raw["status"] == "succeeded" and raw["depends_on"] == ["extract"]
    history = raw["attempt_history"]
    assert [a["status"] for a in history] == ["failed", "succeeded"]
    assert history[0]["error_code"] == "mock_flaky"

    text = awp("run", "task", run_id, "load").output
    lines = text.splitlines()
    assert lines[0].startswith(f"task load  succeeded  run {run_id}  attempts 2/3"), text
    assert "executor mock  action load  timeout 60000 ms" in text
    assert "depends on extract" in text
    first = next(line for line in lines if line.startswith("#1  failed"))
    second = next(line for line in lines if line.startswith("#2  succeeded"))
    for line in (first, second):
        assert f"on cli-task-worker ({history[0]['worker_id']})" in line
        assert re.search(r"started \d\d:\d\d:\d\d\.\d{3}  finished \d\d:\d\d:\d\d\.\d{3}  took \d+\.\d\ds$", line)
    assert "    error mock_flaky: attempt 1 fails (fail_attempts=1)" in text
    output_line = next(line for line in lines if line.startswith("    output {"))
    assert output_line.startswith('    output {"note":"xxxxx') and output_line.endswith("…")  # jsonb key order
    assert len(output_line) == WIDTH, "the preview is cut to the screen width"

    root = awp("run", "task", run_id, "extract").output
    assert "depends on nothing (a root task)" in root
    assert '    output {"n":1}' in root


def test_run_task_of_a_task_without_attempts(awp: Callable[..., Result], tmp_path: Path) -> None:
    apply_file(awp, tmp_path, {"id": "cli-task-idle", "tasks": [mock_task("only")]})
    run_id = awp("run", "start", "cli-task-idle").output.split()[1]
    text = awp("run", "task", run_id, "only").output
    assert "no attempt yet" in text and "attempts 0/1" in text
    awp("run", "cancel", run_id)


def test_run_task_of_an_unknown_run_or_task_is_a_clear_error(awp: Callable[..., Result], tmp_path: Path) -> None:
    missing_run = awp("run", "task", "run_nope", "a", ok=False)
    assert missing_run.exit_code == 1 and "not_found" in missing_run.output and "run_nope" in missing_run.output
    no_traceback(missing_run)
    apply_file(awp, tmp_path, {"id": "cli-task-missing", "tasks": [mock_task("a")]})
    run_id = awp("run", "start", "cli-task-missing").output.split()[1]
    missing_task = awp("run", "task", run_id, "zzz", ok=False)
    assert missing_task.exit_code == 1 and "not_found" in missing_task.output and "zzz" in missing_task.output
    no_traceback(missing_task)
    awp("run", "cancel", run_id)


# ---- awp run start --timeout / --input -------------------------------------------------------------------------


def test_run_start_wait_timeout_says_the_run_is_still_running(
    awp: Callable[..., Result], gw: ServeProcess, tmp_path: Path
) -> None:
    apply_file(awp, tmp_path, {"id": "cli-timeout", "tasks": [mock_task("a")]})  # no worker: it never ends
    result = awp("run", "start", "cli-timeout", "--wait", "--timeout", "1", ok=False)
    assert result.exit_code == EXIT_WAIT_TIMEOUT == 124, result.output
    run_id = result.output.split()[1]
    status = get_run(gw, run_id)["status"]
    assert status in ("pending", "running")
    assert f"run {run_id} is still running after 1s (status {status})" in result.output
    no_traceback(result)

    as_json = awp("run", "start", "cli-timeout", "--wait", "--timeout", "0.5", "--json", ok=False)
    assert as_json.exit_code == EXIT_WAIT_TIMEOUT
    answer = json.loads(as_json.output)
    assert answer["timed_out"] is True and answer["final_status"] is None and answer["run_id"].startswith("run")

    usage = awp("run", "start", "cli-timeout", "--timeout", "1", ok=False)
    assert usage.exit_code == 2 and "--timeout needs --wait" in usage.output
    assert "124" in awp("run", "start", "--help").output, "the exit code is documented"
    for rid in (run_id, answer["run_id"]):
        awp("run", "cancel", rid)


def test_run_start_wait_timeout_is_not_hit_by_a_run_that_ends(
    awp: Callable[..., Result], gw: ServeProcess, tmp_path: Path
) -> None:
    apply_file(awp, tmp_path, {"id": "cli-timeout-ok", "tasks": [mock_task("a", sleep_ms=100)]})
    with Workers(gw) as ws:
        ws.start("cli-timeout-worker")
        result = awp("run", "start", "cli-timeout-ok", "--wait", "--timeout", "30")
    assert "succeeded" in result.output


def test_run_start_with_input(awp: Callable[..., Result], gw: ServeProcess, tmp_path: Path) -> None:
    apply_file(awp, tmp_path, {"id": "cli-input", "tasks": [mock_task("a")]})
    inline = awp("run", "start", "cli-input", "--input", '{"day": 3, "tags": ["a"]}', "--json")
    assert get_run(gw, json.loads(inline.output)["run_id"])["input"] == {"day": 3, "tags": ["a"]}

    path = tmp_path / "input.json"
    path.write_text(json.dumps({"from": "file"}))
    from_file = awp("run", "start", "cli-input", "--input-file", str(path), "--json")
    assert get_run(gw, json.loads(from_file.output)["run_id"])["input"] == {"from": "file"}
    from_stdin = awp("run", "start", "cli-input", "--input-file", "-", "--json", stdin='{"from": "stdin"}')
    assert get_run(gw, json.loads(from_stdin.output)["run_id"])["input"] == {"from": "stdin"}
    without = awp("run", "start", "cli-input", "--json")
    assert get_run(gw, json.loads(without.output)["run_id"])["input"] in ({}, None)

    # The same idempotency key with another input is a conflict, with the same input the same run.
    first = json.loads(
        awp("run", "start", "cli-input", "--idempotency-key", "k1", "--input", '{"a": 1}', "--json").output
    )
    again = json.loads(
        awp("run", "start", "cli-input", "--idempotency-key", "k1", "--input", '{"a": 1}', "--json").output
    )
    assert first["run_id"] == again["run_id"]
    other = awp("run", "start", "cli-input", "--idempotency-key", "k1", "--input", '{"a": 2}', ok=False)
    assert other.exit_code == 1 and "idempotency_conflict" in other.output
    no_traceback(other)
    for r in api(gw, "GET", "/runs?workflow_id=cli-input")["items"]:
        awp("run", "cancel", r["run_id"])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--input", "[1, 2]"], "must be a JSON object, not an array"),
        (["--input", '"text"'], "must be a JSON object, not a string"),
        (["--input", "{nope"], "not valid JSON"),
        (["--input", "{}", "--input-file", "-"], "mutually exclusive"),
        (["--input-file", "/nonexistent/input.json"], "does not exist"),
    ],
    ids=["array", "string", "not-json", "both", "missing-file"],
)
def test_run_start_input_must_be_a_json_object(
    awp: Callable[..., Result], gw: ServeProcess, args: list[str], message: str
) -> None:
    before = len(api(gw, "GET", "/runs")["items"])
    result = awp("run", "start", "cli-input-bad", *args, ok=False)
    assert result.exit_code == 2, result.output
    assert message in result.output
    no_traceback(result)
    assert len(api(gw, "GET", "/runs")["items"]) == before, "no run was started"


# ---- small fixes -----------------------------------------------------------------------------------------------


def test_a_cycle_is_reported_once(awp: Callable[..., Result], tmp_path: Path) -> None:
    self_cycle = {"id": "cli-cycle", "tasks": [{"key": "a", "executor": "mock", "depends_on": ["a"]}]}
    path = tmp_path / "cycle.yaml"
    path.write_text(yaml.safe_dump(self_cycle))
    result = awp("workflow", "apply", str(path), ok=False)
    assert result.exit_code == 1
    assert "invalid_request: dependency cycle: a -> a" in result.output
    assert result.output.count("dependency cycle") == 1, result.output

    dup = {"id": "cli-dup", "tasks": [{"key": "a", "executor": "mock"}, {"key": "a", "executor": "mock"}]}
    path.write_text(yaml.safe_dump(dup))
    result = awp("workflow", "apply", str(path), ok=False)
    assert "invalid_request: duplicate task keys: a" in result.output
    assert result.output.count("duplicate task keys") == 1, result.output


def test_join_message() -> None:
    assert join_message("dependency cycle", "dependency cycle: a -> a") == "dependency cycle: a -> a"
    assert join_message("run not found", "no run r1") == "run not found: no run r1"
    assert join_message("invalid task", None) == "invalid task"
    assert join_message("invalid task", "invalid task") == "invalid task"
    assert join_message("lease", "lease lost") == "lease: lease lost", "only a repeated message is dropped"


def test_cancel_of_a_finished_run_says_so(awp: Callable[..., Result], gw: ServeProcess, tmp_path: Path) -> None:
    apply_file(awp, tmp_path, {"id": "cli-cancel-done", "tasks": [mock_task("a")]})
    with Workers(gw) as ws:
        w = ws.start("cli-cancel-worker")
        run_id = json.loads(awp("run", "start", "cli-cancel-done", "--wait", "--json").output)["run_id"]
        w.signal(signal.SIGTERM)
        w.wait_exit(10)
    result = awp("run", "cancel", run_id)
    assert result.output.strip() == f"run {run_id} already succeeded; nothing to cancel"
    assert get_run(gw, run_id)["status"] == "succeeded"

    apply_file(awp, tmp_path, {"id": "cli-cancel-idle", "tasks": [mock_task("a")]})
    idle = awp("run", "start", "cli-cancel-idle").output.split()[1]
    first = awp("run", "cancel", idle).output  # nothing leased: canceled at once
    assert first.startswith(f"run {idle} canceled (cancel requested at 20") and "None" not in first
    again = awp("run", "cancel", idle).output
    assert again.startswith(f"run {idle} canceled (cancel requested at ") and "None" not in again


def test_cancel_message_of_a_running_run() -> None:
    answer = {"run_id": "run_1", "status": "running", "cancel_requested_at": "2025-01-02T03:04:05+00:00"}
    assert (
        cancel_message(answer)
        == "run run_1 running; cancel requested at 2025-01-02T03:04:05+00:00 (it converges shortly)"
    )
    assert cancel_message({"run_id": "r", "status": "failed", "cancel_requested_at": None}) == (
        "run r already failed; nothing to cancel"
    )


def test_watch_of_a_finished_run_prints_its_real_duration(
    awp: Callable[..., Result], gw: ServeProcess, tmp_path: Path
) -> None:
    apply_file(awp, tmp_path, {"id": "cli-duration", "tasks": [mock_task("a", sleep_ms=700)]})
    with Workers(gw) as ws:
        ws.start("cli-duration-worker")
        run_id = json.loads(awp("run", "start", "cli-duration", "--wait", "--json").output)["run_id"]
    run = wait_run(gw, run_id)
    expected = (datetime.fromisoformat(run["finished_at"]) - datetime.fromisoformat(run["started_at"])).total_seconds()
    assert expected >= 0.7
    watched = awp("run", "watch", run_id).output
    duration = re.search(r"1 task: succeeded 1; (\d+\.\d)s\s*$", watched)
    assert duration is not None, watched
    shown = float(duration.group(1))
    assert shown == pytest.approx(expected, abs=0.051)

    # Canceled before it started: the duration runs from created_at.
    apply_file(awp, tmp_path, {"id": "cli-duration-idle", "tasks": [mock_task("a")]})
    idle = awp("run", "start", "cli-duration-idle").output.split()[1]
    awp("run", "cancel", idle)
    watched = awp("run", "watch", idle, ok=False).output
    assert re.search(r"; \d+\.\ds\s*$", watched) and "watched" not in watched


def test_run_duration_s() -> None:
    base = {"created_at": "2025-01-01T00:00:00+00:00"}
    assert run_duration_s(base) is None
    assert run_duration_s({**base, "finished_at": "2025-01-01T00:00:02.5+00:00"}) == 2.5
    started = {**base, "started_at": "2025-01-01T00:00:01+00:00", "finished_at": "2025-01-01T00:01:01+00:00"}
    assert run_duration_s(started) == 60.0


def test_the_demo_applies_the_example_file_unchanged(awp: Callable[..., Result], gw: ServeProcess) -> None:
    example = examples_dir() / "demo-etl.yaml"
    assert _prepare_definition(NORMAL) == yaml.safe_load(example.read_text())
    fast = _prepare_definition(FAST)
    assert fast["id"] != "demo-etl", "the scaled (--fast) definition has its own workflow id"
    # What `make demo` applies, then what a user applies after it: the same version.
    first = api(gw, "POST", "/workflows", _prepare_definition(NORMAL), {"Idempotency-Key": "demo-like"})
    assert (first["workflow_id"], first["version"]) == ("demo-etl", 1)
    assert "workflow demo-etl version 1" in awp("workflow", "apply", str(example)).output
