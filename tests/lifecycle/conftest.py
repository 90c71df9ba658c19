"""Fixtures for the agent tests: fresh doubles and an agent factory wired to them."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from lifecycle.doubles import FakeInjector, FakeProbe, FakeRuntime, RecordingMetrics
from substrate_gpu.lifecycle import Agent


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
def metrics() -> RecordingMetrics:
    """Recorded metric calls."""
    return RecordingMetrics()


@pytest.fixture
def make_agent(
    runtime: FakeRuntime,
    probe: FakeProbe,
    injector: FakeInjector,
    metrics: RecordingMetrics,
    tmp_path: Path,
) -> Callable[..., Agent]:
    """Build an Agent on the doubles; keyword arguments override the defaults."""

    def build(**overrides: Any) -> Agent:
        kwargs: dict[str, Any] = {
            "runtime": runtime,
            "probe": probe,
            "injector": injector,
            "checkpoint_root": tmp_path / "checkpoints",
            "metrics": metrics,
        }
        kwargs.update(overrides)
        return Agent(**kwargs)

    return build
