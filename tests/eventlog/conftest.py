"""Fixtures for the event-log tests: the lifecycle's in-process doubles and a log path."""

from __future__ import annotations

from pathlib import Path

import pytest
from lifecycle.doubles import FakeInjector, FakeProbe, FakeRuntime


@pytest.fixture
def runtime() -> FakeRuntime:
    """A recording runtime with --leave-running support."""
    return FakeRuntime()


@pytest.fixture
def probe(runtime: FakeRuntime) -> FakeProbe:
    """A probe that sees the runtime's live contexts."""
    return FakeProbe(runtime)


@pytest.fixture
def injector() -> FakeInjector:
    """An injector reporting two devices."""
    return FakeInjector()


@pytest.fixture
def log_path(tmp_path: Path) -> Path:
    """Where the test's event log lives (not created)."""
    return tmp_path / "log" / "events.jsonl"
