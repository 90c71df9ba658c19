"""Finding the real runsc that ``scripts/build-runsc.sh`` builds, and how tests run it.

The binary lives outside the work tree, under
``${SUBSTRATE_GPU_CACHE:-/var/cache/substrate-gpu}/runsc/<pinned version>/runsc`` (the pin is
``scripts/runsc.version``); ``SUBSTRATE_GPU_RUNSC`` overrides the path. Tests skip without
it, and fail under ``SUBSTRATE_GPU_REQUIRE_REAL=1`` (see ``tests/conftest.py``).

:data:`GLOBAL_FLAGS` are the flags every sandbox command gets on this machine; each one's
reason is in docs/runsc.md ("Flags on this machine").
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PIN = REPO / "scripts" / "runsc.version"
BUILD_SCRIPT = REPO / "scripts" / "build-runsc.sh"

#: systrap: the platform that needs no KVM and no ptrace tricks; network=none: actors here
#: need no network, and it spares runsc the host netns setup. See docs/runsc.md.
GLOBAL_FLAGS: tuple[str, ...] = ("--platform=systrap", "--network=none")


def pinned_version() -> str:
    """The gVisor version ``scripts/runsc.version`` pins."""
    for line in PIN.read_text(encoding="utf-8").splitlines():
        if line.startswith("version="):
            return line.removeprefix("version=").strip()
    raise AssertionError(f"{PIN} has no version= line")


def cached_binary() -> Path:
    """Where ``scripts/build-runsc.sh`` puts the pinned runsc."""
    cache = Path(os.environ.get("SUBSTRATE_GPU_CACHE", "/var/cache/substrate-gpu"))
    return cache / "runsc" / pinned_version() / "runsc"


def pinned_source() -> Path | None:
    """The pinned gVisor module's source in the Go module cache (``go mod download`` by
    ``scripts/build-runsc.sh`` leaves it there), or None."""
    module = version = ""
    for line in PIN.read_text(encoding="utf-8").splitlines():
        key, _, value = line.partition("=")
        if key == "module":
            module = value.strip()
        elif key == "version":
            version = value.strip()
    try:
        cache = subprocess.run(
            ["go", "env", "GOMODCACHE"], capture_output=True, text=True, check=True, timeout=30
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    path = Path(cache) / f"{module}@{version}"
    return path if path.is_dir() else None


def find() -> Path | None:
    """The real runsc binary, or None when it has not been built here."""
    override = os.environ.get("SUBSTRATE_GPU_RUNSC")
    path = Path(override) if override else cached_binary()
    return path if path.is_file() and os.access(path, os.X_OK) else None


def run(
    runsc: Path, root: Path, *args: str, check: bool = True, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """``runsc --root ROOT <GLOBAL_FLAGS> ARGS…`` as a plain subprocess (test plumbing)."""
    return subprocess.run(
        [str(runsc), "--root", str(root), *GLOBAL_FLAGS, *args],
        capture_output=True,
        text=True,
        check=check,
        timeout=timeout,
    )


def list_ids(runsc: Path, root: Path) -> list[str]:
    """``runsc list --quiet`` (runsc has no ``-q``): every container id under ``root``."""
    if not root.exists():
        return []
    return run(runsc, root, "list", "--quiet").stdout.split()


def delete_all(runsc: Path, root: Path) -> None:
    """Force-delete every container under ``root``, then unmount the network namespace
    runsc keeps mounted at ``<root>/null-netns`` for ``--network=none`` (fixture teardown)."""
    try:
        for container_id in list_ids(runsc, root):
            run(runsc, root, "delete", "--force", container_id, check=False)
    finally:
        # Even when listing failed. One mount per sandbox that ran under this root, stacked:
        # a single umount left the rest behind, and pytest's clean-up of old temp dirs later
        # died on the busy file.
        netns = root / "null-netns"
        for _ in range(64):
            if not os.path.ismount(netns):
                break
            subprocess.run(["umount", "-l", str(netns)], capture_output=True, check=False)
