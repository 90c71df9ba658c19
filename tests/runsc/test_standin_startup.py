"""The runsc stand-in is a standalone script: a runsc command loads nothing of the package."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from substrate_gpu.testing import node

STANDIN = Path(__file__).resolve().parents[1] / "standins" / "runsc"


def _modules_loaded_by(executable: Path) -> str:
    """The import-time report (``PYTHONPROFILEIMPORTTIME``) of ``executable --version``."""
    done = subprocess.run(
        [str(executable), "--version"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPROFILEIMPORTTIME": "1"},
        timeout=60,
        check=True,
    )
    assert done.stdout.startswith("runsc version "), done.stdout
    return done.stderr


@pytest.mark.parametrize("where", ["tests/standins/runsc", "the simulated node's runsc"])
def test_a_runsc_command_imports_nothing_of_the_package(where: str, tmp_path: Path) -> None:
    """Both ways of running the stand-in (tests, the demo's node) start without substrate_gpu."""
    executable = STANDIN if where.startswith("tests") else node.install_runsc_standin(tmp_path)
    report = _modules_loaded_by(executable)
    assert "import time:" in report  # the report is there: the check below means something
    loaded = [line.rsplit("|", 1)[-1].strip() for line in report.splitlines()]
    assert [m for m in loaded if m == "substrate_gpu" or m.startswith("substrate_gpu.")] == []
