"""stage_soname_links: the links `ldconfig -n` would create, confined to the rootfs.

The oracle is ldconfig itself: for each scenario the libraries are built with gcc, copied
to a plain directory on which `ldconfig -n` runs, and mounted (by destination) into a rootfs
where we stage; the two sets of symlinks must be identical.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
import structlog
from hypothesis import given, settings
from hypothesis import strategies as st
from rootfs_worlds import World, tree_snapshot
from structlog.testing import capture_logs
from support import elflibs
from support.real import missing

from substrate_gpu.exceptions import InjectionError
from substrate_gpu.rootfs import staging
from substrate_gpu.rootfs.sonames import SonameAbsent, SonameCache, SonameFound, SonameUnreadable
from substrate_gpu.rootfs.staging import SkipReason, stage_soname_links

LIBDIR = "/usr/lib/x86_64-linux-gnu"


def _symlinks(directory: Path) -> dict[str, str]:
    if not directory.is_dir():
        return {}
    return {p.name: os.readlink(p) for p in directory.iterdir() if p.is_symlink()}


def _ldconfig_links(libraries: Sequence[Path], work: Path) -> dict[str, str]:
    """The symlinks `ldconfig -n` creates in a directory holding copies of ``libraries``."""
    ldconfig = shutil.which("ldconfig") or shutil.which("ldconfig", path="/usr/sbin:/sbin")
    if ldconfig is None:
        missing("ldconfig")
    work.mkdir()
    for library in libraries:
        shutil.copy2(library, work / library.name)
    subprocess.run([ldconfig, "-n", str(work)], check=True, capture_output=True)
    return _symlinks(work)


def _stage(rootfs: Path, libraries: Sequence[Path], **kwargs: object) -> staging.StagingReport:
    pairs = [(library, f"{LIBDIR}/{library.name}") for library in libraries]
    return stage_soname_links(rootfs, pairs, cache=SonameCache(), **kwargs)  # type: ignore[arg-type]


LDCONFIG_SCENARIOS = [
    pytest.param([("libcuda.so.580.65.06", "libcuda.so.1")], id="driver-library"),
    pytest.param(
        [
            ("libcuda.so.580.65.06", "libcuda.so.1"),
            ("libnvidia-ml.so.580.65.06", "libnvidia-ml.so.1"),
            ("libnvidia-ptxjitcompiler.so.580.65.06", "libnvidia-ptxjitcompiler.so.1"),
            ("libcudadebugger.so.580.65.06", "libcudadebugger.so.1"),
        ],
        id="driver-set",
    ),
    pytest.param([("libfoo.so.1.2.3", "libfoo.so.1.2.3")], id="soname-is-basename"),
    pytest.param([("libnone.so.4.5", None)], id="no-soname"),
    pytest.param(
        [
            ("libfoo.so.1.2", "libfoo.so.1"),
            ("libfoo.so.1.10", "libfoo.so.1"),
            ("libfoo.so.1.9", "libfoo.so.1"),
        ],
        id="highest-version-wins",
    ),
    pytest.param(
        [("libbar.so.2.0", "libbar.so.2"), ("libbar.so.2.0a", "libbar.so.2")],
        id="digit-sorts-after-letter",
    ),
    pytest.param([("libchain.so.3.1", "libchain.so.3.1.0")], id="soname-longer-than-name"),
]


@pytest.mark.parametrize("specs", LDCONFIG_SCENARIOS)
def test_links_equal_ldconfig(tmp_path: Path, specs: list[tuple[str, str | None]]) -> None:
    """The staged links are exactly the links `ldconfig -n` creates for the same files."""
    host = tmp_path / "host-lib64"
    host.mkdir()
    libraries = [elflibs.build_shared_library(host, name, soname) for name, soname in specs]
    expected = _ldconfig_links(libraries, tmp_path / "ldconfig")
    rootfs = tmp_path / "rootfs"
    rootfs.mkdir()
    _stage(rootfs, libraries)
    assert _symlinks(rootfs / LIBDIR.lstrip("/")) == expected


def test_existing_wrong_link_is_replaced_like_ldconfig(tmp_path: Path) -> None:
    """A stale link (an older driver) is repointed, as ldconfig repoints it."""
    host = tmp_path / "host"
    host.mkdir()
    library = elflibs.build_shared_library(host, "libcuda.so.580.65.06", "libcuda.so.1")
    rootfs = tmp_path / "rootfs"
    (rootfs / LIBDIR.lstrip("/")).mkdir(parents=True)
    (rootfs / LIBDIR.lstrip("/") / "libcuda.so.1").symlink_to("libcuda.so.535.1")
    report = _stage(rootfs, [library])
    assert [link.link for link in report.replaced] == [f"{LIBDIR}/libcuda.so.1"]
    assert os.readlink(rootfs / LIBDIR.lstrip("/") / "libcuda.so.1") == "libcuda.so.580.65.06"


def test_staging_twice_is_idempotent(tmp_path: Path) -> None:
    """A second staging leaves the same tree and reports every link as existing."""
    host = tmp_path / "host"
    host.mkdir()
    libraries = [
        elflibs.build_shared_library(host, "libcuda.so.580.65.06", "libcuda.so.1"),
        elflibs.build_shared_library(host, "libnvidia-ml.so.580.65.06", "libnvidia-ml.so.1"),
    ]
    rootfs = tmp_path / "rootfs"
    rootfs.mkdir()
    first = _stage(rootfs, libraries)
    tree = tree_snapshot(rootfs)
    second = _stage(rootfs, libraries)
    assert tree_snapshot(rootfs) == tree
    assert second.existing == first.created
    assert (second.created, second.replaced) == ((), ())


def test_report_names_library_link_and_target(tmp_path: Path) -> None:
    """A created link is reported with the host library, the container link and its target."""
    host = tmp_path / "host"
    host.mkdir()
    library = elflibs.build_shared_library(host, "libcuda.so.580.65.06", "libcuda.so.1")
    rootfs = tmp_path / "rootfs"
    rootfs.mkdir()
    report = _stage(rootfs, [library])
    assert report.created == (
        staging.StagedLink(library, f"{LIBDIR}/libcuda.so.1", "libcuda.so.580.65.06"),
    )


# --- skipped libraries ----------------------------------------------------------------------


def _write(directory: Path, name: str, data: bytes) -> Path:
    path = directory / name
    path.write_bytes(data)
    return path


SKIP_CASES = [
    pytest.param(
        lambda d: elflibs.build_shared_library(d, "libplain.so", "libplain.so.1"),
        SkipReason.NOT_VERSIONED,
        False,
        id="no-dot-so-dot",
    ),
    pytest.param(
        lambda d: _write(d, "libtext.so.1", b"INPUT(-lfoo)\n"),
        SkipReason.UNREADABLE,
        True,
        id="linker-script",
    ),
    pytest.param(
        lambda d: _write(d, "libempty.so.1", b""), SkipReason.UNREADABLE, True, id="empty-file"
    ),
    pytest.param(
        lambda d: _write(d, "libtrunc.so.1", b"\x7fELF\x02\x01\x01"),
        SkipReason.UNREADABLE,
        True,
        id="truncated",
    ),
    pytest.param(
        lambda d: (d / "libdir.so.1").mkdir() or d / "libdir.so.1",
        SkipReason.UNREADABLE,
        True,
        id="directory",
    ),
    pytest.param(
        lambda d: d / "libmissing.so.1", SkipReason.UNREADABLE, True, id="missing-on-host"
    ),
    pytest.param(
        lambda d: elflibs.build_static_executable(d, "libstatic.so.1"),
        SkipReason.NO_SONAME,
        False,
        id="static-executable",
    ),
    pytest.param(
        lambda d: elflibs.build_object_file(d, "libobj.so.1"),
        SkipReason.NO_SONAME,
        False,
        id="object-file",
    ),
    pytest.param(
        lambda d: elflibs.build_shared_library(d, "libself.so.1", "libself.so.1"),
        SkipReason.SONAME_IS_BASENAME,
        False,
        id="soname-is-basename",
    ),
    pytest.param(
        lambda d: elflibs.build_shared_library(d, "libevil.so.1", "../../../etc/ld.so.preload"),
        SkipReason.UNSAFE_SONAME,
        True,
        id="soname-with-dotdot",
    ),
    pytest.param(
        lambda d: elflibs.build_shared_library(d, "libslash.so.1", "sub/libslash.so.1"),
        SkipReason.UNSAFE_SONAME,
        True,
        id="soname-with-slash",
    ),
    pytest.param(
        lambda d: elflibs.build_shared_library(d, "libdot.so.1", "."),
        SkipReason.UNSAFE_SONAME,
        True,
        id="soname-dot",
    ),
    pytest.param(
        lambda d: elflibs.build_shared_library(d, "libdotdot.so.1", ".."),
        SkipReason.UNSAFE_SONAME,
        True,
        id="soname-dotdot",
    ),
    pytest.param(
        lambda d: _write(d, "libblank.so.1", elflibs.synthetic_elf(b"")),
        SkipReason.UNSAFE_SONAME,
        True,
        id="soname-empty",
    ),
]


@pytest.mark.parametrize(("make", "reason", "warns"), SKIP_CASES)
def test_library_is_skipped_with_reason(
    tmp_path: Path, make: Callable[[Path], Path], reason: SkipReason, warns: bool
) -> None:
    """Each kind of unusable library is skipped with its reason, logged, and nothing is created."""
    host = tmp_path / "host"
    host.mkdir()
    library = make(host)
    rootfs = tmp_path / "rootfs"
    rootfs.mkdir()
    with capture_logs() as logs:
        report = _stage(rootfs, [library])
    assert [(s.library, s.reason) for s in report.skipped] == [(library, reason)]
    assert report.created == ()
    assert not any(p.is_symlink() for p in rootfs.rglob("*"))
    skipped_logs = [e for e in logs if e["event"] == "soname_link_skipped"]
    assert [(e["library"], e["reason"]) for e in skipped_logs] == [(str(library), reason.value)]
    assert (skipped_logs[0]["log_level"] == "warning") is warns


def test_file_under_the_link_name_is_left_alone(tmp_path: Path) -> None:
    """An image file already named like the SONAME is kept and the library reported occupied."""
    host = tmp_path / "host"
    host.mkdir()
    library = elflibs.build_shared_library(host, "libcuda.so.580.65.06", "libcuda.so.1")
    rootfs = tmp_path / "rootfs"
    (rootfs / LIBDIR.lstrip("/")).mkdir(parents=True)
    (rootfs / LIBDIR.lstrip("/") / "libcuda.so.1").write_text("image content")
    report = _stage(rootfs, [library])
    assert [s.reason for s in report.skipped] == [SkipReason.OCCUPIED]
    assert (rootfs / LIBDIR.lstrip("/") / "libcuda.so.1").read_text() == "image content"


def test_link_name_that_is_another_mount_destination_is_not_created(tmp_path: Path) -> None:
    """libfoo.so.1.2 (SONAME libfoo.so.1) next to a mounted libfoo.so.1: the mount wins."""
    host = tmp_path / "host"
    host.mkdir()
    exact = elflibs.build_shared_library(host, "libfoo.so.1", "libfoo.so.1")
    newer = elflibs.build_shared_library(host, "libfoo.so.1.2", "libfoo.so.1")
    rootfs = tmp_path / "rootfs"
    rootfs.mkdir()
    report = _stage(rootfs, [exact, newer])
    assert {(s.library.name, s.reason) for s in report.skipped} == {
        ("libfoo.so.1", SkipReason.SONAME_IS_BASENAME),
        ("libfoo.so.1.2", SkipReason.OCCUPIED),
    }
    assert not (rootfs / LIBDIR.lstrip("/") / "libfoo.so.1").is_symlink()


def test_hostile_destination_directory_is_skipped_not_raised(world: World) -> None:
    """An image whose library directory is a dangling absolute symlink gets a skip and a warning."""
    library = elflibs.build_shared_library(
        world.host / "lib64", "libcuda.so.580.65.06", "libcuda.so.1"
    )
    (world.root / "usr/lib/x86_64-linux-gnu").symlink_to(world.host / "etc")
    before = world.snapshot()
    with capture_logs() as logs:
        report = _stage(world.root, [library])
    assert world.snapshot() == before
    assert [s.reason for s in report.skipped] == [SkipReason.UNSAFE_DESTINATION]
    assert [e["log_level"] for e in logs if e["event"] == "soname_link_skipped"] == ["warning"]


def test_absolute_symlink_directory_keeps_the_link_inside_the_rootfs(world: World) -> None:
    """`usr/lib/x86_64-linux-gnu -> /<host>/lib64`: the link lands in the rootfs's copy of it."""
    library = elflibs.build_shared_library(
        world.host / "lib64", "libcuda.so.580.65.06", "libcuda.so.1"
    )
    mirror = world.root / str(world.host / "lib64").lstrip("/")
    mirror.mkdir(parents=True)
    (world.root / "usr/lib/x86_64-linux-gnu").symlink_to(world.host / "lib64")
    before = world.snapshot()
    report = _stage(world.root, [library])
    assert world.snapshot() == before
    assert len(report.created) == 1
    assert os.readlink(mirror / "libcuda.so.1") == "libcuda.so.580.65.06"


def test_a_symlinked_subdirectory_of_a_staged_directory_is_resolved_in_the_rootfs(
    world: World,
) -> None:
    """`usr/lib/vdpau -> /<host>/lib64` under an already opened usr/lib: resolved in-root too."""
    cuda = elflibs.build_shared_library(
        world.host / "lib64", "libcuda.so.580.65.06", "libcuda.so.1"
    )
    vdpau = elflibs.build_shared_library(
        world.host / "lib64", "libvdpau_nvidia.so.580.65.06", "libvdpau_nvidia.so.1"
    )
    mirror = world.root / str(world.host / "lib64").lstrip("/")
    mirror.mkdir(parents=True)
    (world.root / "usr/lib/vdpau").symlink_to(world.host / "lib64")
    before = world.snapshot()
    report = stage_soname_links(
        world.root,
        [(cuda, f"/usr/lib/{cuda.name}"), (vdpau, f"/usr/lib/vdpau/{vdpau.name}")],
        cache=SonameCache(),
    )
    assert world.snapshot() == before
    assert len(report.created) == 2
    assert os.readlink(world.root / "usr/lib/libcuda.so.1") == cuda.name
    assert os.readlink(mirror / "libvdpau_nvidia.so.1") == vdpau.name


def test_a_missing_subdirectory_of_a_staged_directory_is_created(tmp_path: Path) -> None:
    """Links in /usr/lib64 and /usr/lib64/vdpau of an empty rootfs: both directories made."""
    host = tmp_path / "host"
    host.mkdir()
    cuda = elflibs.build_shared_library(host, "libcuda.so.580.65.06", "libcuda.so.1")
    vdpau = elflibs.build_shared_library(
        host, "libvdpau_nvidia.so.580.65.06", "libvdpau_nvidia.so.1"
    )
    rootfs = tmp_path / "rootfs"
    rootfs.mkdir()
    report = stage_soname_links(
        rootfs,
        [(vdpau, f"/usr/lib64/vdpau/{vdpau.name}"), (cuda, f"/usr/lib64/{cuda.name}")],
        cache=SonameCache(),
    )
    assert [link.link for link in report.created] == [
        "/usr/lib64/vdpau/libvdpau_nvidia.so.1",
        "/usr/lib64/libcuda.so.1",
    ]
    assert os.readlink(rootfs / "usr/lib64/vdpau/libvdpau_nvidia.so.1") == vdpau.name


def test_unusable_rootfs_raises_injection_error(tmp_path: Path) -> None:
    """A rootfs that is not a directory is an I/O failure, raised as InjectionError."""
    host = tmp_path / "host"
    host.mkdir()
    library = elflibs.build_shared_library(host, "libcuda.so.580.65.06", "libcuda.so.1")
    not_a_dir = tmp_path / "rootfs"
    not_a_dir.write_text("")
    with pytest.raises(InjectionError, match="while staging SONAME links"):
        _stage(not_a_dir, [library])


def test_a_rootfs_that_is_a_symlink_is_refused_not_followed(tmp_path: Path) -> None:
    """rootfs -> a directory elsewhere: InjectionError, and nothing is written where it points."""
    host = tmp_path / "host"
    host.mkdir()
    library = elflibs.build_shared_library(host, "libcuda.so.580.65.06", "libcuda.so.1")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "rootfs").symlink_to(elsewhere)
    with pytest.raises(InjectionError, match="rootfs .* is a symbolic link"):
        _stage(tmp_path / "rootfs", [library])
    assert list(elsewhere.iterdir()) == []


def test_given_logger_is_used(tmp_path: Path) -> None:
    """A bound logger passed in receives the events (with its bound context)."""
    host = tmp_path / "host"
    host.mkdir()
    library = elflibs.build_shared_library(host, "libcuda.so.580.65.06", "libcuda.so.1")
    rootfs = tmp_path / "rootfs"
    rootfs.mkdir()
    with capture_logs() as logs:
        _stage(rootfs, [library], log=structlog.get_logger().bind(actor="a1"))
    assert [(e["event"], e.get("actor"), e.get("created")) for e in logs] == [
        ("soname_links_staged", "a1", 1)
    ]


# --- the pure core -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("left", "right", "sign"),
    [
        pytest.param("libfoo.so.1.10", "libfoo.so.1.9", 1, id="numeric-not-lexical"),
        pytest.param("libfoo.so.1.2", "libfoo.so.1.2", 0, id="equal"),
        pytest.param("libfoo.so.1.2.1", "libfoo.so.1.2", 1, id="longer-wins"),
        pytest.param("libfoo.so.2.0", "libfoo.so.2.0a", -1, id="prefix-sorts-first"),
        pytest.param("libfoo.so.2a", "libfoo.so.20", -1, id="letter-before-digit"),
        pytest.param("libfoo.so.010", "libfoo.so.9", 1, id="leading-zero-is-numeric"),
    ],
)
def test_libcmp_matches_glibc_ordering(left: str, right: str, sign: int) -> None:
    """Version ordering is glibc's _dl_cache_libcmp."""
    result = staging.libcmp(left, right)
    assert (result > 0) - (result < 0) == sign


@settings(max_examples=200, deadline=None, database=None)
@given(
    left=st.text(alphabet="lib.so0123456789a", max_size=12),
    right=st.text(alphabet="lib.so0123456789a", max_size=12),
)
def test_libcmp_is_antisymmetric(left: str, right: str) -> None:
    """Swapping the operands flips the sign."""
    forward, backward = staging.libcmp(left, right), staging.libcmp(right, left)
    assert (forward > 0) - (forward < 0) == -((backward > 0) - (backward < 0))


@pytest.mark.parametrize(
    ("destination", "result", "expected"),
    [
        pytest.param(
            f"{LIBDIR}/libcuda.so.580", SonameFound("libcuda.so.1"), "libcuda.so.1", id="link"
        ),
        pytest.param(
            f"{LIBDIR}/libcuda.so",
            SonameFound("libcuda.so.1"),
            SkipReason.NOT_VERSIONED,
            id="unversioned",
        ),
        pytest.param(
            f"{LIBDIR}/libx.so.1", SonameAbsent("none"), SkipReason.NO_SONAME, id="absent"
        ),
        pytest.param(
            f"{LIBDIR}/libx.so.1", SonameUnreadable("bad"), SkipReason.UNREADABLE, id="unreadable"
        ),
        pytest.param(
            f"{LIBDIR}/libx.so.1", SonameFound("a\0b"), SkipReason.UNSAFE_SONAME, id="nul-soname"
        ),
        pytest.param(
            f"{LIBDIR}/", SonameFound("libx.so.1"), SkipReason.UNSAFE_DESTINATION, id="no-file-name"
        ),
        pytest.param(
            f"{LIBDIR}/libx.so.1",
            SonameFound("l" * 256),
            SkipReason.UNSAFE_SONAME,
            id="long-soname",
        ),
    ],
)
def test_plan_decides_per_library(destination: str, result: object, expected: object) -> None:
    """The pure planner turns (library, destination, SONAME) into a link or a skip reason."""
    planned, skipped = staging.plan_soname_links([(Path("/host/lib"), destination, result)])  # type: ignore[list-item]
    if isinstance(expected, SkipReason):
        assert ([s.reason for s in skipped], planned) == ([expected], [])
    else:
        assert [(p.name, p.directory) for p in planned] == [(expected, LIBDIR)]
