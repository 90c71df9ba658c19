"""Confined writes: RESOLVE_IN_ROOT resolution and symlink creation inside an untrusted rootfs.

Every hostile-image test asserts two things: the decoy host tree beside the rootfs is
byte-for-byte unchanged, and where the link landed (or that it was refused).
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rootfs_worlds import World, tree_snapshot
from support.real import missing

from substrate_gpu.exceptions import RootfsEscapeError
from substrate_gpu.rootfs import confined
from substrate_gpu.rootfs.confined import ConfinedPathError, LinkOutcome, ensure_symlink_in_root

LINK = "/usr/lib/x86_64-linux-gnu/libcuda.so.1"
TARGET = "libcuda.so.580.65.06"


def _mirror(world: World, host_path: Path) -> Path:
    """The path inside the rootfs that an absolute host path names under RESOLVE_IN_ROOT."""
    return world.root / str(host_path).lstrip("/")


# --- pure path handling ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        pytest.param("/usr/lib/libc.so.6", ("usr/lib", "libc.so.6"), id="absolute"),
        pytest.param("usr//lib/./libc.so.6", ("usr/lib", "libc.so.6"), id="redundant-separators"),
        pytest.param("/libc.so.6", ("", "libc.so.6"), id="at-root"),
        pytest.param("/a/../b/libc.so.6", ("a/../b", "libc.so.6"), id="dotdot-kept-for-resolution"),
    ],
)
def test_split_link_path(path: str, expected: tuple[str, str]) -> None:
    """A link path splits into a parent (resolved later) and a plain final name."""
    assert confined.split_link_path(path) == expected


@pytest.mark.parametrize(
    "path",
    [
        pytest.param("/", id="root"),
        pytest.param("", id="empty"),
        pytest.param("/usr/lib/..", id="dotdot-last"),
        pytest.param("/usr/lib/.", id="dot-last"),
        pytest.param("/usr/lib\0/x", id="nul"),
        pytest.param("/usr/lib/", id="trailing-slash"),
    ],
)
def test_split_link_path_rejects_paths_without_a_plain_name(path: str) -> None:
    """A link path must end in a plain file name."""
    with pytest.raises(ValueError):
        confined.split_link_path(path)


@pytest.mark.parametrize(
    ("name", "plain"),
    [
        pytest.param("libcuda.so.1", True, id="library"),
        pytest.param("", False, id="empty"),
        pytest.param(".", False, id="dot"),
        pytest.param("..", False, id="dotdot"),
        pytest.param("a/b", False, id="slash"),
        pytest.param("a\0b", False, id="nul"),
        pytest.param("...", True, id="three-dots-is-a-name"),
        pytest.param("l" * 255, True, id="name-max"),
        pytest.param("l" * 256, False, id="longer-than-name-max"),
    ],
)
def test_is_plain_name(name: str, plain: bool) -> None:
    """Only a single directory entry name is plain."""
    assert confined.is_plain_name(name) is plain


# --- ordinary use ------------------------------------------------------------------------------


def test_creates_missing_directories_and_the_link(world: World, resolver: str) -> None:
    """Missing parent directories are created (0755) and the relative link placed in them."""
    outcome = ensure_symlink_in_root(world.root, LINK, TARGET)
    directory = world.root / "usr/lib/x86_64-linux-gnu"
    assert outcome is LinkOutcome.CREATED
    assert os.readlink(directory / "libcuda.so.1") == TARGET
    assert stat.S_IMODE(directory.stat().st_mode) == 0o755 & ~_umask()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_same_link_again_is_a_no_op(world: World, resolver: str) -> None:
    """An existing link with the same target is reported as existing and left as is."""
    ensure_symlink_in_root(world.root, LINK, TARGET)
    before = os.lstat(world.root / LINK.lstrip("/")).st_ino
    assert ensure_symlink_in_root(world.root, LINK, TARGET) is LinkOutcome.EXISTS
    assert os.lstat(world.root / LINK.lstrip("/")).st_ino == before


def test_link_with_another_target_is_replaced_without_leftovers(world: World) -> None:
    """A link pointing elsewhere is replaced atomically; no temporary name is left behind."""
    ensure_symlink_in_root(world.root, LINK, "libcuda.so.1.old")
    assert ensure_symlink_in_root(world.root, LINK, TARGET) is LinkOutcome.REPLACED
    directory = world.root / "usr/lib/x86_64-linux-gnu"
    assert os.listdir(directory) == ["libcuda.so.1"]
    assert os.readlink(directory / "libcuda.so.1") == TARGET


@pytest.mark.parametrize("kind", [pytest.param("file", id="file"), pytest.param("dir", id="dir")])
def test_file_or_directory_under_the_link_name_is_left_alone(world: World, kind: str) -> None:
    """A file or directory holding the link name is never replaced (ldconfig does the same)."""
    path = world.root / LINK.lstrip("/")
    path.parent.mkdir(parents=True)
    if kind == "file":
        path.write_text("the image's own file")
    else:
        path.mkdir()
    assert ensure_symlink_in_root(world.root, LINK, TARGET) is LinkOutcome.OCCUPIED
    assert not path.is_symlink()


def test_open_dir_in_root_without_create_refuses_missing_directories(world: World) -> None:
    """Lookup-only resolution reports a missing directory instead of creating it."""
    with pytest.raises(ConfinedPathError, match="does not exist"):
        with confined.open_dir_in_root(world.root, "/opt/missing"):
            pass
    assert not (world.root / "opt").exists()


def test_confined_path_error_is_a_rootfs_escape_error() -> None:
    """Callers catching RootfsEscapeError also catch resolution refusals."""
    assert issubclass(ConfinedPathError, RootfsEscapeError)


# --- hostile images: one trick per test --------------------------------------------------------


def test_absolute_symlink_directory_resolves_inside_the_rootfs(world: World, resolver: str) -> None:
    """`usr/lib/x86_64-linux-gnu -> /<host>/etc` lands in the rootfs's copy of that path."""
    mirror = _mirror(world, world.host / "etc")
    mirror.mkdir(parents=True)
    (world.root / "usr/lib/x86_64-linux-gnu").symlink_to(world.host / "etc")
    before = world.snapshot()
    assert ensure_symlink_in_root(world.root, LINK, TARGET) is LinkOutcome.CREATED
    assert world.snapshot() == before
    assert os.readlink(mirror / "libcuda.so.1") == TARGET


def test_absolute_symlink_to_a_path_missing_in_the_rootfs_is_refused(
    world: World, resolver: str
) -> None:
    """`usr/lib/x86_64-linux-gnu -> /<host>/etc` with no such path in the rootfs writes nothing."""
    (world.root / "usr/lib/x86_64-linux-gnu").symlink_to(world.host / "etc")
    before, root_before = world.snapshot(), tree_snapshot(world.root)
    with pytest.raises(ConfinedPathError, match="missing"):
        ensure_symlink_in_root(world.root, LINK, TARGET)
    assert world.snapshot() == before
    assert tree_snapshot(world.root) == root_before


def test_relative_dotdot_chain_stops_at_the_root(world: World, resolver: str) -> None:
    """`usr/lib/x86_64-linux-gnu -> ../../../../…/<host>/lib64` cannot climb out of the rootfs."""
    climb = "../" * 30 + str(world.host / "lib64").lstrip("/")
    mirror = _mirror(world, world.host / "lib64")
    mirror.mkdir(parents=True)
    (world.root / "usr/lib/x86_64-linux-gnu").symlink_to(climb)
    before = world.snapshot()
    assert ensure_symlink_in_root(world.root, LINK, TARGET) is LinkOutcome.CREATED
    assert world.snapshot() == before
    assert os.readlink(mirror / "libcuda.so.1") == TARGET


def test_short_dotdot_chain_reaching_a_sibling_is_clamped(world: World, resolver: str) -> None:
    """`usr/lib -> ../../host` (the rootfs's sibling, naively) means `/host` in the rootfs."""
    (world.root / "usr/lib").rmdir()
    (world.root / "usr/lib").symlink_to("../../host")
    (world.root / "host" / "x86_64-linux-gnu").mkdir(parents=True)
    before = world.snapshot()
    assert ensure_symlink_in_root(world.root, LINK, TARGET) is LinkOutcome.CREATED
    assert world.snapshot() == before
    assert os.readlink(world.root / "host/x86_64-linux-gnu/libcuda.so.1") == TARGET


def test_directory_replaced_by_a_symlink_between_stagings(world: World, resolver: str) -> None:
    """A directory swapped for a symlink to the host after a first staging is not followed."""
    ensure_symlink_in_root(world.root, LINK, TARGET)
    directory = world.root / "usr/lib/x86_64-linux-gnu"
    for entry in directory.iterdir():
        entry.unlink()
    directory.rmdir()
    directory.symlink_to(world.host / "lib64")
    before = world.snapshot()
    with pytest.raises(ConfinedPathError):
        ensure_symlink_in_root(world.root, LINK, TARGET)
    assert world.snapshot() == before
    assert directory.is_symlink()


def test_symlink_loop_is_an_error_not_a_hang(world: World, resolver: str) -> None:
    """`a -> b`, `b -> a` on the way fails with ELOOP semantics after 40 links."""
    (world.root / "usr/lib/a").symlink_to("b")
    (world.root / "usr/lib/b").symlink_to("a")
    (world.root / "usr/lib/x86_64-linux-gnu").symlink_to("a")
    before = world.snapshot()
    with pytest.raises(ConfinedPathError, match="too many levels of symbolic links"):
        ensure_symlink_in_root(world.root, LINK, TARGET)
    assert world.snapshot() == before


def test_self_referencing_symlink_is_an_error(world: World, resolver: str) -> None:
    """`usr/lib/x86_64-linux-gnu -> x86_64-linux-gnu` is a loop of one."""
    (world.root / "usr/lib/x86_64-linux-gnu").symlink_to("x86_64-linux-gnu")
    with pytest.raises(ConfinedPathError, match="too many levels"):
        ensure_symlink_in_root(world.root, LINK, TARGET)


def test_final_component_symlink_to_the_host_is_replaced_never_followed(
    world: World, resolver: str
) -> None:
    """`libcuda.so.1 -> /<host>/etc/passwd` is replaced by our link; the host file is untouched."""
    directory = world.root / "usr/lib/x86_64-linux-gnu"
    directory.mkdir()
    (directory / "libcuda.so.1").symlink_to(world.host / "etc" / "passwd")
    before = world.snapshot()
    assert ensure_symlink_in_root(world.root, LINK, TARGET) is LinkOutcome.REPLACED
    assert world.snapshot() == before
    assert os.readlink(directory / "libcuda.so.1") == TARGET


def test_final_component_dangling_symlink_to_the_host_creates_nothing_there(
    world: World, resolver: str
) -> None:
    """`libcuda.so.1 -> /<host>/lib64/new` is replaced; nothing appears at the host path."""
    directory = world.root / "usr/lib/x86_64-linux-gnu"
    directory.mkdir()
    (directory / "libcuda.so.1").symlink_to(world.host / "lib64" / "new")
    before = world.snapshot()
    assert ensure_symlink_in_root(world.root, LINK, TARGET) is LinkOutcome.REPLACED
    assert world.snapshot() == before


def test_dangling_intermediate_symlink_is_refused(world: World, resolver: str) -> None:
    """`usr/lib/x86_64-linux-gnu -> /nonexistent/dir` is neither followed out nor materialised."""
    (world.root / "usr/lib/x86_64-linux-gnu").symlink_to("/nonexistent/dir")
    before, root_before = world.snapshot(), tree_snapshot(world.root)
    with pytest.raises(ConfinedPathError, match="missing"):
        ensure_symlink_in_root(world.root, LINK, TARGET)
    assert world.snapshot() == before
    assert tree_snapshot(world.root) == root_before


@pytest.mark.parametrize(
    "link_path",
    [
        pytest.param("/../../../../../../usr/lib/x86_64-linux-gnu/libcuda.so.1", id="leading"),
        pytest.param("/usr/lib/../../../../../usr/lib/x86_64-linux-gnu/libcuda.so.1", id="middle"),
    ],
)
def test_dotdot_in_the_container_path_never_rises_above_the_root(
    world: World, resolver: str, link_path: str
) -> None:
    """`..` components of the container path itself stop at the rootfs root."""
    before = world.snapshot()
    assert ensure_symlink_in_root(world.root, link_path, TARGET) is LinkOutcome.CREATED
    assert world.snapshot() == before
    assert os.readlink(world.root / LINK.lstrip("/")) == TARGET


def test_dotdot_into_a_sibling_name_lands_inside_the_rootfs(world: World, resolver: str) -> None:
    """`/../host/lib64/x` names the rootfs's own `/host/lib64`, created there."""
    before = world.snapshot()
    ensure_symlink_in_root(world.root, "/../host/lib64/libcuda.so.1", TARGET)
    assert world.snapshot() == before
    assert os.readlink(world.root / "host/lib64/libcuda.so.1") == TARGET


def test_regular_file_as_intermediate_component_is_refused(world: World, resolver: str) -> None:
    """A file where a directory is expected is an error, not something to replace."""
    (world.root / "usr/lib/x86_64-linux-gnu").write_text("not a directory")
    with pytest.raises(ConfinedPathError, match="not a directory"):
        ensure_symlink_in_root(world.root, LINK, TARGET)


def test_symlink_to_a_file_as_intermediate_component_is_refused(
    world: World, resolver: str
) -> None:
    """`usr/lib/x86_64-linux-gnu -> /etc/passwd` (a file in the rootfs) is refused."""
    (world.root / "etc").mkdir()
    (world.root / "etc/passwd").write_text("image passwd")
    (world.root / "usr/lib/x86_64-linux-gnu").symlink_to("/etc/passwd")
    with pytest.raises(ConfinedPathError, match="not a directory"):
        ensure_symlink_in_root(world.root, LINK, TARGET)


def test_rootfs_itself_may_be_reached_through_a_symlink(tmp_path: Path, resolver: str) -> None:
    """The rootfs path given by the caller is trusted and may itself be a symlink."""
    real = tmp_path / "real-rootfs"
    real.mkdir()
    (tmp_path / "alias").symlink_to(real)
    ensure_symlink_in_root(tmp_path / "alias", LINK, TARGET)
    assert os.readlink(real / LINK.lstrip("/")) == TARGET


# --- the two resolvers agree ---------------------------------------------------------------------

_NAMES = ("a", "b", "c")
_TARGETS = st.sampled_from(
    ["a", "b", "c", "a/b", "../a", "/a", "/b/c", "..", "../../..", "/", ".", "c/../a", "/x"]
)
_PATHS = st.lists(st.sampled_from([*_NAMES, "..", "."]), min_size=0, max_size=5).map("/".join)


def _resolve(root: Path, path: str) -> tuple[int, int] | str:
    try:
        with confined.open_dir_in_root(root, path) as fd:
            info = os.fstat(fd)
            return (info.st_dev, info.st_ino)
    except ConfinedPathError as e:
        return "error: " + e.problem.split()[0]


@settings(max_examples=150, deadline=None, database=None)
@given(
    layout=st.dictionaries(
        st.lists(st.sampled_from(_NAMES), min_size=1, max_size=2).map("/".join),
        st.one_of(st.none(), _TARGETS),
        max_size=6,
    ),
    path=_PATHS,
)
def test_userspace_walk_agrees_with_openat2(layout: dict[str, str | None], path: str) -> None:
    """For random trees of directories and symlinks, both resolvers open the same directory."""
    kernel_probe = os.open("/", os.O_PATH)
    try:
        probe = confined._kernel.openat2_in_root(kernel_probe, ".")
    finally:
        os.close(kernel_probe)
    if probe is None:
        missing("openat2(RESOLVE_IN_ROOT)")
    os.close(probe)
    with tempfile.TemporaryDirectory() as top:
        root = Path(top)
        for rel, target in sorted(layout.items()):
            entry = root / rel
            if not entry.parent.is_dir() or entry.parent.is_symlink() or os.path.lexists(entry):
                continue
            if target is None:
                entry.mkdir()
            else:
                entry.symlink_to(target)
        root_fd = os.open(root, os.O_PATH | os.O_DIRECTORY)
        try:
            kernel_fd = confined._kernel.openat2_in_root(root_fd, path)
            kernel: tuple[int, int] | None = None
            if kernel_fd is not None:
                info = os.fstat(kernel_fd)
                os.close(kernel_fd)
                kernel = (info.st_dev, info.st_ino)
            try:
                walk_fd = confined._walk_in_root(root, root_fd, path, create=False)
            except ConfinedPathError:
                walk = None
            else:
                info = os.fstat(walk_fd)
                os.close(walk_fd)
                walk = (info.st_dev, info.st_ino)
        finally:
            os.close(root_fd)
        assert walk == kernel


@pytest.mark.parametrize("parent_is_new", [False, True], ids=["parent-existing", "parent-new"])
def test_open_child_dir_says_whether_it_created_the_directory(
    tmp_path: Path, parent_is_new: bool
) -> None:
    """A missing child is created (and said so); an existing one is opened, even when the
    caller believed the parent new; a symlink is left to the careful path."""
    (tmp_path / "there").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "there")
    parent = os.open(tmp_path, os.O_PATH | os.O_DIRECTORY)
    try:
        for name, created in (("missing", True), ("there", False)):
            opened = confined.open_child_dir(parent, name, create=True, parent_is_new=parent_is_new)
            assert opened is not None
            os.close(opened[0])
            assert opened[1] is created
        assert (tmp_path / "missing").is_dir()
        assert confined.open_child_dir(parent, "link", create=True) is None
    finally:
        os.close(parent)
