"""Fixtures for the observability tests: real promtool/prometheus binaries, a fresh registry.

The binaries follow the suite's rule: skip on a developer machine without them, fail when
``SUBSTRATE_GPU_REQUIRE_REAL=1`` (CI), so CI never goes green by skipping.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog
from prometheus_client import CollectorRegistry
from support.real import missing

REPO = Path(__file__).resolve().parents[2]
METRICS_DIR = REPO / "metrics"


def _binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        missing(name)
    return path


@pytest.fixture(scope="session")
def promtool() -> str:
    """The real promtool binary (skip, or fail under CI, when absent)."""
    return _binary("promtool")


@pytest.fixture(scope="session")
def prometheus_binary() -> str:
    """The real prometheus binary (skip, or fail under CI, when absent)."""
    return _binary("prometheus")


@pytest.fixture
def registry() -> CollectorRegistry:
    """A fresh registry per test, never the global one."""
    return CollectorRegistry()


@pytest.fixture
def restore_logging() -> Iterator[None]:
    """Undo configure_logging: root handlers, levels and structlog's configuration."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    transitions_level = logging.getLogger("transitions").level
    yield
    for handler in list(root.handlers):
        if handler not in handlers:
            root.removeHandler(handler)
            handler.close()
    root.setLevel(level)
    logging.getLogger("transitions").setLevel(transitions_level)
    structlog.reset_defaults()
    structlog.contextvars.clear_contextvars()
