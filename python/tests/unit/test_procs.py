"""awp.dev.procs, the one helper that starts child ``awp`` processes (demo, tests, benchmarks): ``python -m awp``,
the log file, readiness, and SIGTERM-then-SIGKILL. Real processes, no database; a few seconds in all."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from awp import __version__
from awp.dev import procs


def test_python_m_awp_is_the_awp_command(tmp_path: Path) -> None:
    log = tmp_path / "version.log"
    proc = procs.start(["--version"], log_path=log)
    assert proc.args == [sys.executable, "-m", "awp", "--version"]
    assert proc.wait(30) == 0
    assert log.read_text().strip() == f"awp, version {__version__}"


def test_exit_codes_pass_through(tmp_path: Path) -> None:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "AWP_DATABASE_URL": "postgresql://nobody@127.0.0.1:1/x"}
    proc = procs.start(["check"], log_path=tmp_path / "check.log", env=env)
    assert proc.wait(30) == 1
    assert "connection failed" in procs.log_tail(tmp_path / "check.log")


def test_wait_ready_fails_at_once_with_the_log_when_the_process_exits(tmp_path: Path) -> None:
    log = tmp_path / "serve.log"
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}  # no tokens: awp serve refuses to start
    proc = procs.start(["serve", "--port", "1"], log_path=log, env=env)
    started = time.monotonic()
    with pytest.raises(RuntimeError, match=r"awp serve exited with [1-9]") as info:
        procs.wait_ready(proc, lambda: False, timeout=60, what="awp serve", log_path=log)
    assert time.monotonic() - started < 50, "it did not wait for the timeout"
    assert procs.log_tail(log) and procs.log_tail(log) in str(info.value)


def test_wait_ready_times_out_and_returns_the_checks_value(tmp_path: Path) -> None:
    proc = procs.spawn([sys.executable, "-c", "import time; time.sleep(60)"], log_path=tmp_path / "sleep.log")
    try:
        with pytest.raises(TimeoutError, match=r"timed out after 0\.3s waiting for sleeper to be ready"):
            procs.wait_ready(proc, lambda: None, timeout=0.3, what="sleeper")
        assert procs.wait_ready(proc, lambda: {"ok": 1}, timeout=5, what="sleeper") == {"ok": 1}
    finally:
        assert procs.stop(proc, 10) == -signal.SIGTERM


def test_stop_kills_what_ignores_sigterm_and_its_whole_group(tmp_path: Path) -> None:
    """A child that ignores SIGTERM is SIGKILLed after the timeout, with the process it started (own session)."""
    log = tmp_path / "stubborn.log"
    script = (
        "import signal, subprocess, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "child = subprocess.Popen(['sleep', '60']); print(child.pid, flush=True); time.sleep(60)"
    )
    proc = procs.spawn([sys.executable, "-c", script], log_path=log, new_session=True)
    grandchild = procs.wait_ready(proc, lambda: log.read_text().strip(), timeout=30, what="stubborn")
    started = time.monotonic()
    assert procs.stop(proc, 0.5) == -signal.SIGKILL
    assert time.monotonic() - started < 20
    deadline = time.monotonic() + 20
    while _running(int(grandchild)):
        assert time.monotonic() < deadline, f"the grandchild {grandchild} survived its group's SIGKILL"
        time.sleep(0.05)


def test_stop_after_the_caller_signalled_sends_no_second_sigterm(tmp_path: Path) -> None:
    """``signalled=True``: the caller already sent SIGTERM (a second one tells an awp worker to exit at once)."""
    log = tmp_path / "counter.log"
    script = (
        "import signal, sys, time\n"
        "seen = []\n"
        "def on_term(*_):\n"
        "    seen.append(1); print('SIGTERM', len(seen), flush=True)\n"
        "    if len(seen) == 1: return\n"
        "    sys.exit(3)\n"
        "signal.signal(signal.SIGTERM, on_term); print('ready', flush=True)\n"
        "deadline = time.monotonic() + 1.0\n"
        "while time.monotonic() < deadline or not seen: time.sleep(0.01)\n"
    )
    proc = procs.spawn([sys.executable, "-c", script], log_path=log)
    procs.wait_ready(proc, lambda: "ready" in log.read_text(), timeout=30, what="counter")
    proc.send_signal(signal.SIGTERM)
    assert procs.stop(proc, 30, signalled=True) == 0
    assert log.read_text().split() == ["ready", "SIGTERM", "1"]


def test_kill_reaps_and_returns_the_exit_code(tmp_path: Path) -> None:
    proc = procs.spawn([sys.executable, "-c", "import time; time.sleep(60)"], log_path=tmp_path / "k.log")
    assert procs.kill(proc) == -signal.SIGKILL
    assert procs.kill(proc) == -signal.SIGKILL  # again: nothing to do


def _running(pid: int) -> bool:
    """The process exists and is not a zombie (a zombie waits for a parent that may not reap it here)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"
