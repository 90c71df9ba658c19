"""The documented embedding example runs as written."""

from __future__ import annotations

import runpy
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
    assert "restoring -> running on restored" in out
    assert "actors by state: {'running': 1}" in out
