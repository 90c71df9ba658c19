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
    assert {p.name for p in BENCH.glob("*.py")} >= {
        "bench_injection.py",
        "bench_sonames.py",
        "bench_cli.py",
    }


@pytest.fixture(scope="module", params=sorted(BENCH.glob("*.py")), ids=lambda p: p.name)
def smoke_run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """``<script> --smoke``, run once per script (its checks share the run)."""
    script: Path = request.param
    env = {**os.environ, "TMPDIR": str(tmp_path_factory.mktemp(script.stem))}
    return subprocess.run(
        [sys.executable, str(script), "--smoke"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=120,
        check=False,
    )


def test_benchmark_runs_in_smoke_mode(smoke_run: subprocess.CompletedProcess[str]):
    """``<script> --smoke`` exits 0 within two minutes and prints figures."""
    result = smoke_run
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert any(ch.isdigit() for ch in result.stdout), result.stdout


def _warnings(output: str) -> list[str]:
    """structlog warning lines, in its console form or its JSON form."""
    return [
        line
        for line in output.splitlines()
        if "[warning" in line or '"level": "warning"' in line or '"level":"warning"' in line
    ]


def test_benchmark_smoke_prints_no_warnings(smoke_run: subprocess.CompletedProcess[str]):
    """A benchmark's run is its figures, not a warning per actor (a stand-in that behaves
    unlike the tool it replaces shows up here: bench_lifecycle's runtime once wrote no image
    directory, and every checkpoint warned that it had no manifest)."""
    assert _warnings(smoke_run.stdout + smoke_run.stderr) == []
