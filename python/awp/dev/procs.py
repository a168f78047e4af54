"""Child ``awp`` processes (``awp serve``, ``awp worker``, …): the one way the demo, the tests and the
benchmarks start, watch and stop them.

    proc = procs.start(["serve", "--port", "8080"], env=env, log_path=log_dir / "serve.log")
    procs.wait_ready(proc, probe, timeout=30, what="awp serve", log_path=log_dir / "serve.log")
    procs.stop(proc)                          # SIGTERM, and SIGKILL if it is still there after 10 s

- :func:`awp_command` is ``[sys.executable, "-m", "awp", *args]``: this interpreter and so this environment's
  ``awp`` package, whatever ``PATH`` holds.
- :func:`start`: stdin from /dev/null, stdout and stderr appended to ``log_path``, ``PYTHONUNBUFFERED=1`` (the
  log is current while it runs). ``new_session``: its own process group, so a Ctrl-C in the terminal reaches
  only the parent, which then stops its children in order. ``die_with_parent`` (Linux): the kernel SIGKILLs
  it when the parent dies, even by kill -9.
- :func:`wait_for`: poll a check until it gives something truthy, :class:`TimeoutError` after ``timeout`` seconds
  (the tests' ``wait_until`` and the benchmark's ``wait_for`` are this). :func:`wait_ready`: the same for a
  child process, failing at once, with the log's tail, when the process exits.
- :func:`stop`: SIGTERM and wait (an ``awp worker`` drains, ``awp serve`` closes its pool), then :func:`kill`.
  :func:`kill`: SIGKILL (its whole process group when it leads one) and reap.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TypedDict, TypeVar, Unpack

T = TypeVar("T")

log = logging.getLogger("awp.procs")  # the log's name, not the module's (docs/operations.md, Logs)

_PR_SET_PDEATHSIG = 1


def awp_command(*args: str) -> list[str]:
    """The command line of ``awp ARGS`` run by this interpreter."""
    return [sys.executable, "-m", "awp", *args]


def _die_with_parent() -> None:  # runs in the child, between fork and exec
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class SpawnOptions(TypedDict, total=False):
    env: Mapping[str, str] | None  # the whole environment (default: this process's)
    cwd: Path | str | None
    new_session: bool
    die_with_parent: bool


def start(args: Sequence[str], *, log_path: Path, **options: Unpack[SpawnOptions]) -> subprocess.Popen[bytes]:
    """Start ``awp ARGS``, its output appended to ``log_path``."""
    return spawn(awp_command(*args), log_path=log_path, **options)


def spawn(
    cmd: Sequence[str],
    *,
    log_path: Path,
    env: Mapping[str, str] | None = None,
    cwd: Path | str | None = None,
    new_session: bool = False,
    die_with_parent: bool = False,
) -> subprocess.Popen[bytes]:
    """:func:`start` for any command line (e.g. the benchmark's peer, procrastinate's workers)."""
    full_env = dict(os.environ if env is None else env)
    full_env.setdefault("PYTHONUNBUFFERED", "1")
    with open(log_path, "ab") as log_file:
        return subprocess.Popen(
            cmd,
            env=full_env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=new_session,
            preexec_fn=_die_with_parent if die_with_parent else None,
        )


def log_tail(log_path: Path, lines: int = 40) -> str:
    """The last ``lines`` lines of a log ("" when it cannot be read)."""
    with contextlib.suppress(OSError):
        return "\n".join(log_path.read_text(errors="replace").splitlines()[-lines:])
    return ""


def wait_for(check: Callable[[], T | None], timeout: float, what: str, interval: float = 0.05) -> T:
    """Call ``check`` until it returns something truthy and return that; :class:`TimeoutError` after
    ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(interval)


def wait_ready(
    proc: subprocess.Popen[bytes],
    check: Callable[[], T | None],
    *,
    timeout: float,
    what: str,
    log_path: Path | None = None,
    interval: float = 0.05,
) -> T:
    """:func:`wait_for` ``check`` while the process runs: :class:`RuntimeError` as soon as it has exited,
    :class:`TimeoutError` after ``timeout`` seconds (both with the log's tail)."""
    tail = (lambda: "\n" + log_tail(log_path)) if log_path is not None else (lambda: "")

    def running_check() -> T | None:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}{tail()}")
        return check()

    try:
        return wait_for(running_check, timeout, f"{what} to be ready", interval)
    except TimeoutError as e:
        raise TimeoutError(f"{e}{tail()}") from None


def kill(proc: subprocess.Popen[bytes]) -> int:
    """SIGKILL (the whole process group when the process leads one: it was started with ``new_session``) and
    reap; returns the exit code."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if os.getpgid(proc.pid) == proc.pid:
                os.killpg(proc.pid, signal.SIGKILL)
            else:
                proc.kill()
    return proc.wait()


def stop(proc: subprocess.Popen[bytes], timeout: float = 10.0, *, signalled: bool = False) -> int:
    """SIGTERM (unless ``signalled``: the caller already sent it, and a second one means "exit at once" to a
    worker), wait up to ``timeout`` seconds, then :func:`kill`; returns the exit code."""
    if proc.poll() is None and not signalled:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        log.warning("process %d did not stop in %gs after SIGTERM: killing it", proc.pid, timeout)
        return kill(proc)
