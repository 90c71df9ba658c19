"""Suite-wide fixtures and the rule for tests that need real components.

Tests that need root (mknod, mounts) or a real runc skip on a developer machine without
them, but **fail** when ``SUBSTRATE_GPU_REQUIRE_REAL=1`` (set by ``.ci/run``), so CI can
never go green by skipping the end-to-end tests (the rule lives in ``support/real.py``).

The run fails when its tests leave a process, a runc/runsc container or a mount behind
(``support/leaks.py``, registered here as a plugin: each xdist worker checks its own).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog
from support import real_runsc as real_runsc_
from support.real import missing

pytest_plugins = ("support.leaks",)


@pytest.fixture(scope="session", autouse=True)
def _structlog_loggers_follow_each_configuration() -> Iterator[None]:
    """No structlog logger cached on first use in the test processes: many configurations
    come and go in one of them (the CLI run in-process configures logging, capture_logs
    and the observability fixtures reconfigure it), and a logger cached under an earlier
    one would log past a later capture, or print, depending on which tests ran before."""
    configure = structlog.configure

    def uncached(*args: Any, **kwargs: Any) -> None:
        kwargs["cache_logger_on_first_use"] = False
        configure(*args, **kwargs)

    structlog.configure = uncached
    try:
        yield
    finally:
        structlog.configure = configure


@pytest.fixture(scope="session")
def require_root() -> None:
    """Skip (or fail under CI) unless running as root."""
    if os.geteuid() != 0:
        missing("root")


@pytest.fixture(scope="session")
def runc_path(require_root: None) -> str:
    """The real runc binary (skip, or fail under CI, when absent)."""
    path = shutil.which("runc")
    if path is None:
        missing("runc")
    return path


@pytest.fixture
def anyio_backend() -> str:
    """Run anyio tests on asyncio (the node agent's loop)."""
    return "asyncio"


@pytest.fixture(scope="session")
def real_runsc() -> Path:
    """The real runsc built by ``scripts/build-runsc.sh`` (skip, or fail under CI, when absent)."""
    found = real_runsc_.find()
    if found is None:
        missing(
            f"real runsc at {real_runsc_.cached_binary()}",
            "is not built (run scripts/build-runsc.sh)",
        )
        raise AssertionError("unreachable")
    return found
