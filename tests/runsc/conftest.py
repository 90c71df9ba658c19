"""Fixtures for driving the runsc driver against the stand-in runsc (tests/standins/runsc)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support import runc_bundle

from substrate_gpu.runsc import driver

STANDIN = Path(__file__).resolve().parents[1] / "standins" / "runsc"


class ArgvLog:
    """The file the stand-in appends its argv to, one JSON list per line."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def entries(self) -> list[list[str]]:
        """Every command line the stand-in was run with, in order."""
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines()]


@pytest.fixture
def argv_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ArgvLog:
    """Record the stand-in's command lines for this test."""
    path = tmp_path / "runsc-argv.jsonl"
    monkeypatch.setenv("RUNSC_STANDIN_ARGV_LOG", str(path))
    return ArgvLog(path)


@pytest.fixture
def runsc_root(tmp_path: Path) -> Path:
    """A fresh runsc/runc state root."""
    root = tmp_path / "runsc-root"
    root.mkdir()
    return root


@pytest.fixture
def runc_root(runsc_root: Path, runc_path: str) -> Iterator[Path]:
    """The runsc root, with every container force-deleted at teardown (even on failure)."""
    yield runsc_root
    runc_bundle.delete_all(runsc_root, runc=runc_path)


@pytest.fixture
def make_driver(runsc_root: Path, argv_log: ArgvLog) -> Callable[..., driver.RunscDriver]:
    """Build a RunscDriver over the stand-in, with short timeouts."""

    def make(**timeouts: float) -> driver.RunscDriver:
        base = {"create": 20.0, "start": 10.0, "checkpoint": 20.0, "restore": 20.0}
        base.update(timeouts)
        return driver.RunscDriver(
            driver.RunscConfig(
                root=runsc_root, runsc=str(STANDIN), timeouts=driver.Timeouts(**base)
            )
        )

    return make
