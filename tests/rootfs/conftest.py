"""Fixtures for the rootfs tests: a rootfs next to a decoy "host" tree, and both resolvers."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from rootfs_worlds import World
from support.real import missing

from substrate_gpu.rootfs import confined


@pytest.fixture
def world(tmp_path: Path) -> World:
    """A rootfs with /usr/lib, and a host tree with etc/passwd and lib64/."""
    root = tmp_path / "rootfs"
    (root / "usr" / "lib").mkdir(parents=True)
    host = tmp_path / "host"
    (host / "etc").mkdir(parents=True)
    (host / "etc" / "passwd").write_text("root:x:0:0::/root:/bin/sh\n")
    (host / "lib64").mkdir()
    return World(root, host)


@pytest.fixture(params=["kernel", "userspace"])
def resolver(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Run a test with the openat2 fast path, then with the userspace walk alone."""
    if request.param == "userspace":
        monkeypatch.setattr(confined._kernel, "enabled", False)
    else:
        fd = os.open("/", os.O_PATH)
        try:
            probe = confined._kernel.openat2_in_root(fd, ".")
        finally:
            os.close(fd)
        if probe is None:
            missing("openat2(RESOLVE_IN_ROOT)")
        os.close(probe)
    yield request.param
