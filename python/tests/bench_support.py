"""benchmarks/report.py loaded for the tests of its tables (python/tests/tools/test_bench_*.py), and a committed
full run to render them from."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]
RUN = REPO / "benchmarks" / "results" / "bench-full-20261202T162243Z.json"  # written before issue 46's scenarios


def report() -> ModuleType:
    if str(REPO / "benchmarks") not in sys.path:  # report.py imports its siblings (report_format, ...) as top-level
        sys.path.append(str(REPO / "benchmarks"))
    spec = importlib.util.spec_from_file_location("bench_report", REPO / "benchmarks" / "report.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
