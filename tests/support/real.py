"""The one rule for tests that need a real component (a tool, a kernel feature, root).

On a developer machine without it the test skips; under ``SUBSTRATE_GPU_REQUIRE_REAL=1`` (set
by ``.ci/run``) it **fails**, so CI can never go green by skipping: gcc, readelf, ldconfig,
glibc, openat2, root, runc, podman, promtool and Prometheus all go through :func:`missing`.
"""

from __future__ import annotations

import os
from typing import NoReturn

import pytest

REQUIRE_REAL = os.environ.get("SUBSTRATE_GPU_REQUIRE_REAL") == "1"


def missing(what: str, reason: str = "is not available") -> NoReturn:
    """Skip the test because ``what`` is missing here, or fail it under REQUIRE_REAL."""
    if REQUIRE_REAL:
        pytest.fail(f"{what} is required here (SUBSTRATE_GPU_REQUIRE_REAL=1): it {reason}")
    pytest.skip(f"{what} {reason}")


def gpu_missing(reason: str) -> NoReturn:
    """Skip a ``gpu`` test: no GPU (or its driver tools) here. Never a failure, even under
    REQUIRE_REAL, because CI has no GPU; the tests run on a lent GPU machine instead."""
    pytest.skip(reason)
