"""Every benchmark still runs: each ``tests/bench/*.py`` in its ``--smoke`` mode.

Benchmarks are run on demand (tests/bench/README.md), so nothing else notices when one stops
running. Scripts are discovered by glob: a new benchmark is covered the day it lands, and
must have a ``--smoke`` mode (tiny sizes, seconds, no timing judged). Timings are never
asserted here, only that the script runs to the end and prints its figures.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent / "bench"
REPO = BENCH.parents[1]


def test_benchmarks_are_discovered():
    """The glob finds the benchmark scripts (an empty parametrisation would test nothing)."""
    assert {p.name for p in BENCH.glob("*.py")} >= {"bench_injection.py", "bench_sonames.py"}


@pytest.mark.parametrize("script", sorted(BENCH.glob("*.py")), ids=lambda p: p.name)
def test_benchmark_runs_in_smoke_mode(script: Path, tmp_path: Path):
    """``<script> --smoke`` exits 0 within a minute and prints figures."""
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, str(script), "--smoke"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert any(ch.isdigit() for ch in result.stdout), result.stdout
