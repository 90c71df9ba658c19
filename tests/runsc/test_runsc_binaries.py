"""One driver, several runsc builds (issue 31 §5): :meth:`RunscDriver.for_binary` runs a
staged binary with its own features and supported-driver list, detected once per SHA-256.

The builds are stand-in wrappers that differ in their bytes: each sets the version it
reports and the drivers it lists before running the stand-in (``RUNSC_STANDIN_VERSION``,
``RUNSC_STANDIN_DRIVERS``), as two gVisor releases would.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path
from typing import Any

import pytest
from support.runsc_builds import build

from substrate_gpu.runsc import api, driver

pytestmark = pytest.mark.anyio


@pytest.fixture
def builds(tmp_path: Path) -> tuple[Path, Path]:
    old = build(tmp_path / "static" / "old", "release-20250512.0", "550.90.07")
    new = build(tmp_path / "static" / "new", "release-20261101.0", "550.90.07,580.65.06")
    return old, new


def _driver(tmp_path: Path, runsc: Path) -> driver.RunscDriver:
    return driver.RunscDriver(driver.RunscConfig(root=tmp_path / "root", runsc=str(runsc)))


def _calls(binary: Path, word: str) -> list[str]:
    """The builds of ``binary``'s directory run with ``word`` among their arguments, in
    order (each build logs ``$0 $*`` beside its siblings)."""
    log = binary.parent.parent / "calls.log"
    lines = log.read_text().splitlines() if log.exists() else []
    return [line.split()[0] for line in lines if word in line.split()[1:]]


async def test_a_staged_binary_has_its_own_features(
    tmp_path: Path, builds: tuple[Path, Path], argv_log: Any
) -> None:
    """The agent's runsc and a staged one answer their own version and digest."""
    old, new = builds
    agent = _driver(tmp_path, old)
    staged = agent.for_binary(str(new))
    mine, theirs = await agent.features(), await staged.features()
    assert (mine.version, theirs.version) == (
        "runsc version release-20250512.0",
        "runsc version release-20261101.0",
    )
    assert theirs.binary_sha256 == hashlib.sha256(new.read_bytes()).hexdigest()
    assert mine.binary_sha256 == hashlib.sha256(old.read_bytes()).hexdigest()
    # A sandbox of that binary (its own root) asks the binary's, not the agent's.
    assert await staged.for_actor("a.1").features() == theirs
    assert staged.for_actor("a.1").config.runsc == str(new)


async def test_features_are_detected_once_per_digest(
    tmp_path: Path, builds: tuple[Path, Path], argv_log: Any
) -> None:
    """Asked again, or of a copy with the same bytes at another path, nothing is re-run;
    another build is detected on its first use."""
    old, new = builds
    agent = _driver(tmp_path, old)
    copy = tmp_path / "static" / "sha256-copy" / "runsc"
    copy.parent.mkdir()
    shutil.copy2(new, copy)
    await agent.for_binary(str(new)).features()
    await agent.for_binary(str(new)).for_actor("a.1").features()
    assert (await agent.for_binary(str(copy)).features()).version.endswith("20261101.0")
    await agent.features()
    assert _calls(new, "--version") == [str(new), str(old)]


async def test_a_binary_rewritten_in_place_is_detected_again(
    tmp_path: Path, builds: tuple[Path, Path], argv_log: Any
) -> None:
    """The digest is kept while the file stats the same: new bytes are a new build."""
    old, new = builds
    agent = _driver(tmp_path, old)
    assert (await agent.for_binary(str(new)).features()).version.endswith("20261101.0")
    build(new.parent, "release-20270101.0", "580.65.06")
    assert (await agent.for_binary(str(new)).features()).version.endswith("20270101.0")


async def test_the_supported_driver_list_is_the_binarys_and_cached(
    tmp_path: Path, builds: tuple[Path, Path], argv_log: Any
) -> None:
    """Each build lists its own drivers; a second ask runs nothing."""
    old, new = builds
    agent = _driver(tmp_path, old)
    staged = agent.for_binary(str(new))
    assert await agent.list_supported_drivers() == ("550.90.07",)
    assert await staged.list_supported_drivers() == ("550.90.07", "580.65.06")
    assert await staged.for_actor("a.1").list_supported_drivers() == ("550.90.07", "580.65.06")
    assert _calls(new, "list-supported-drivers") == [str(old), str(new)]


async def test_every_command_of_a_staged_sandbox_runs_its_binary(
    tmp_path: Path, builds: tuple[Path, Path], argv_log: Any
) -> None:
    """The binary is the whole runtime's for that sandbox: a state query runs it too."""
    old, new = builds
    staged = _driver(tmp_path, old).for_binary(str(new)).for_actor("a.1")
    with pytest.raises(api.ContainerNotFoundError):
        await staged.state("_pause")
    assert _calls(new, "state") == [str(new)]
    (state,) = [a for a in argv_log.entries() if "state" in a]
    assert str(tmp_path / "root" / "a.1") in state
