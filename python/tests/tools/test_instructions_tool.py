"""benchmarks/instructions.py, the instruction counter of docs/performance.md ("Measuring a change"): two variants
(the working tree, and a git revision exported with ``git archive``), each prepared in a real cluster and then run
by a real single-user backend under valgrind's callgrind, grouped calls and single completions. A minute or so."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
LINE = re.compile(r"^  (\S+)\s+([\d.]+) M per call\s+([\d.]+) M per completion\s+ratio ([\d.]+)$", re.M)


def instructions(*args: str) -> subprocess.CompletedProcess[str]:
    """benchmarks/instructions.py run with ``args``, its output captured."""
    tool = str(REPO / "benchmarks" / "instructions.py")
    return subprocess.run([sys.executable, tool, *args], cwd=REPO, capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("group", [2, 1], ids=["group-path", "single-path"])
def test_instructions_counts_each_variant_per_call(group: int, tmp_path: Path) -> None:
    profile = tmp_path / "out.cg"
    sizes = ["--group", str(group), "--steps", "3", "--tasks", "40", "--pre", "0", "--profile", str(profile)]
    out = instructions(".", "HEAD", *sizes)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"instructions per call of {group} completion(s)" in out.stdout, out.stdout
    rows = LINE.findall(out.stdout)
    assert [r[0] for r in rows] == [".", "HEAD"], out.stdout
    for _, per_call, per_completion, _ratio in rows:
        # a call completes and refills `group` tasks: millions of instructions, never a count of start-up alone
        assert 0.5 < float(per_call) < 100, out.stdout
        assert abs(float(per_completion) * group - float(per_call)) < 0.01, out.stdout
    assert rows[0][3] == "1.000", out.stdout
    # the ratio is the second count over the first (printed rounded to 3 decimals)
    assert abs(float(rows[1][3]) - float(rows[1][1]) / float(rows[0][1])) < 0.002, out.stdout
    # the kept profile is callgrind's, of the backend that ran the steps
    head = profile.read_text(errors="replace")[:4000]
    assert "creator: callgrind" in head and "--single" in head, head


def test_instructions_counts_the_batch_route_per_task() -> None:
    """--batch 3: one worker of 3 slots sends its leases' lines (report_progress_many, with AB_LOGS) and then its
    results with a claim (complete_tasks), as the batch route does; lines cost instructions (the variant with them
    counts more per task than the one without)."""
    sizes = ["--batch", "3", "--steps", "3", "--tasks", "40", "--pre", "0"]
    out = instructions(".:AB_LOGS=0", ".:AB_LOGS=10", *sizes)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "instructions per call of the batch route with 3 leases" in out.stdout, out.stdout
    rows = LINE.findall(out.stdout)
    assert [r[0] for r in rows] == [".:AB_LOGS=0", ".:AB_LOGS=10"], out.stdout
    for _, per_call, per_task, _ratio in rows:
        assert 0.5 < float(per_call) < 100, out.stdout
        assert abs(float(per_task) * 3 - float(per_call)) < 0.01, out.stdout
    assert float(rows[1][3]) > 1.02, out.stdout  # 10 lines per task are not free
