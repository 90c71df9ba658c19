"""The documented embedding example runs as written."""

from __future__ import annotations

import runpy
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "embed_agent.py"


def test_embedding_example_runs(capsys: pytest.CaptureFixture[str]) -> None:
    """examples/embed_agent.py drives an actor through refusal, suspend and restore."""
    namespace = runpy.run_path(str(EXAMPLE), run_name="example")
    anyio.run(namespace["main"])  # every wait in the example has its own timeout
    out = capsys.readouterr().out
    assert "running -> running on suspend_requested  (suspend refused" in out
    assert "restoring -> verifying on restored" in out  # a GPU actor is checked first
    assert "verifying -> running on gpus_verified" in out
    assert "actors by state: {'running': 1}" in out


def test_embedding_example_warns_only_of_its_refusal() -> None:
    """Run as a user runs it, the example prints no log line (it configures no logging, and
    the library writes nothing until configured); with the standard library's logging
    configured, it logs one warning, the suspend it is meant to see refused (its runtime once
    made no image directory, so every checkpoint warned that it had no manifest)."""
    plain = subprocess.run(
        [sys.executable, str(EXAMPLE)], capture_output=True, text=True, timeout=60, check=False
    )
    assert plain.returncode == 0, plain.stderr
    assert plain.stderr == ""
    assert "warning" not in plain.stdout.lower()
    configured = subprocess.run(
        [
            sys.executable,
            "-c",
            (
                "import logging, runpy\n"
                "logging.basicConfig(level=logging.WARNING)\n"
                f"runpy.run_path({str(EXAMPLE)!r}, run_name='__main__')"
            ),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert configured.returncode == 0, configured.stderr
    output = configured.stdout + configured.stderr
    assert "checkpoint has no manifest" not in output
    warnings = [line for line in output.splitlines() if line.startswith("WARNING:")]
    assert len(warnings) == 1 and "suspend refused" in warnings[0], warnings
