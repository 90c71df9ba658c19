"""Removing a per-actor runsc root: the mount table parsed, real mounts detached, then rm.

The mounts are real (root: a tmpfs, a bind mount of this process's network namespace file,
as runsc's ``null-netns`` is, stacked twice, and a mount below a path with a space); the
parse is checked on mountinfo lines as the kernel writes them.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from substrate_gpu import _mountinfo
from substrate_gpu.runsc import driver, roots


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        pytest.param(
            "36 35 98:0 /mnt1 /mnt/a rw,noatime master:1 - ext3 /dev/root rw",
            (36, "/mnt/a"),
            id="plain",
        ),
        pytest.param(
            "612 29 0:4 net:[4026531840] /tmp/r/a.1/null-netns rw shared:1 - nsfs nsfs rw",
            (612, "/tmp/r/a.1/null-netns"),
            id="nsfs",
        ),
        pytest.param(
            r"40 35 0:50 / /tmp/with\040space\134x rw - tmpfs tmpfs rw",
            (40, "/tmp/with space\\x"),
            id="octal-escapes",
        ),
    ],
)
def test_a_mountinfo_line_gives_its_id_and_mount_point(line: str, expected: tuple[int, str]):
    assert roots.mount_points(line + "\n\n") == [expected]


def test_only_mounts_at_or_below_the_root_count_deepest_and_newest_first():
    """``/r/a1`` is beside ``/r/a``, not below it; two mounts stacked at one point come off
    newest first."""
    points = [(1, "/r/a"), (2, "/r/a/x"), (3, "/r/a1"), (4, "/r/a/x/y"), (5, "/r/a/x"), (6, "/")]
    assert roots.under(points, "/r/a") == [
        (4, "/r/a/x/y"),
        (5, "/r/a/x"),
        (2, "/r/a/x"),
        (1, "/r/a"),
    ]


def _mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True, capture_output=True)


@pytest.fixture
def mounted(require_root: None, tmp_path: Path):
    """A root like runsc leaves one: null-netns bind-mounted twice, a tmpfs below a space."""
    root = tmp_path / "runsc-root" / "actor.1"
    (root / "dir with space").mkdir(parents=True)
    netns = root / "null-netns"
    netns.touch()
    _mount("--bind", "/proc/self/ns/net", str(netns))
    _mount("--bind", "/proc/self/ns/net", str(netns))
    _mount("-t", "tmpfs", "tmpfs", str(root / "dir with space"))
    (root / "dir with space" / "file").write_text("x")
    beside = tmp_path / "runsc-root" / "actor.10"
    beside.mkdir()
    _mount("-t", "tmpfs", "tmpfs", str(beside))
    yield root, beside
    for path in (beside, netns, netns, root / "dir with space"):
        subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)


def test_a_root_is_unmounted_and_removed_and_its_neighbour_left(mounted):
    root, beside = mounted
    assert len(roots.mounts_under(root)) == 3
    roots.remove(root)
    assert not root.exists()
    assert roots.mounts_under(root) == []
    assert roots.mounts_under(beside) == [str(beside)]  # actor.10 is not under actor.1


def test_removing_a_root_that_is_not_there_is_nothing(tmp_path: Path):
    roots.remove(tmp_path / "absent")


def test_a_mount_that_will_not_come_off_is_an_error_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """umount2 refusing (EPERM): RootRemovalError naming the mount; nothing removed."""
    root = tmp_path / "actor.1"
    root.mkdir()
    info = tmp_path / "mountinfo"
    info.write_text(f"99 1 0:4 net:[1] {root}/null-netns rw - nsfs nsfs rw\n")
    monkeypatch.setattr(_mountinfo, "_umount_detach", lambda path: 1)
    with pytest.raises(roots.RootRemovalError, match=r"cannot unmount .*null-netns"):
        roots.remove(root, info)
    assert root.exists()


@pytest.mark.anyio
async def test_the_driver_removes_only_an_actors_own_root(tmp_path: Path):
    """for_actor's root and pid-file directory go; the agent's own root is refused."""
    parent = driver.RunscDriver(driver.RunscConfig(root=tmp_path / "root", pid_dir=tmp_path / "p"))
    actor = parent.for_actor("a.1")
    for path in (tmp_path / "root" / "a.1" / "_pause", tmp_path / "p" / "a.1"):
        path.mkdir(parents=True)
    assert actor.has_root()
    await actor.remove_root()
    assert not actor.has_root()
    assert not (tmp_path / "root" / "a.1").exists() and (tmp_path / "root").exists()
    with pytest.raises(ValueError, match="the agent's runsc root"):
        await parent.remove_root()
