"""benchmarks/ab.py, the A/B tool of docs/performance.md ("Measuring a change"), in its SQL mode: two variants (the
working tree, and a git revision exported with ``git archive``) measured in turns in one throwaway cluster, each
with a median and its ratio to the first per round. Real PostgreSQL, a real subprocess; a few seconds."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


def run_ab(*args: str) -> subprocess.CompletedProcess[str]:
    """``benchmarks/ab.py`` with these arguments, from the repository (it must end well: its output otherwise)."""
    out = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "ab.py"), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return out


@pytest.mark.parametrize("shape", [["--runs", "2"], ["--group", "3"]], ids=["runs", "group"])
def test_ab_sql_measures_each_variant_in_turns(shape: list[str]) -> None:
    """Single completions (each refill to another run), or three workers' completions grouped per call."""
    out = run_ab("sql", ".", "HEAD", "--rounds", "2", "--tasks", "20", *shape)
    rounds = re.findall(r"^round (\d+): ([\d.]+)  ([\d.]+)$", out.stdout, re.M)
    assert [r[0] for r in rounds] == ["1", "2"], out.stdout
    assert all(float(a) > 0 and float(b) > 0 for _, a, b in rounds), out.stdout
    lines = out.stdout.split("backend ms/completion: median (per-round ratio to '.')\n", 1)[1].splitlines()
    base, other = (re.match(r"^  (\S+)\s+([\d.]+)   ratio median ([\d.]+)  \((.*)\)$", line) for line in lines[:2])
    assert base is not None and other is not None, out.stdout
    assert (base[1], base[3], base[4]) == (".", "1.000", "1.00 1.00"), out.stdout
    assert other[1] == "HEAD" and len(other[4].split()) == 2, out.stdout
    # each round's ratio is that round's two measurements divided (printed rounded: 3 and 2 decimals)
    ratios = [float(x) for x in other[4].split()]
    assert all(abs(r - float(b) / float(a)) < 0.02 for r, (_, a, b) in zip(ratios, rounds, strict=True)), out.stdout


@pytest.mark.parametrize("shape", [[], ["--group", "2"]], ids=["single", "group"])
def test_ab_sql_completions_can_carry_log_lines(shape: list[str]) -> None:
    """``AB_LOGS=N``: each completion carries N log lines (its ``live_output``); a malformed one would be refused
    (AWREQ) and end the tool with an error, a variant without lines is measured beside it."""
    out = run_ab("sql", ".", ".:AB_LOGS=3", "--rounds", "1", "--tasks", "10", *shape)
    assert re.search(r"^  \.:AB_LOGS=3\s+[\d.]+   ratio median", out.stdout, re.M), out.stdout
