"""Composing a container's rootfs from cached layers (atelet's rootfs-overlay.json), on real
overlayfs mounts: what the merged view shows, what is refused, and that nothing stays mounted."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from substrate_gpu.rootfs import overlay


def _layer(root: Path, name: str, files: dict[str, str], **record: list[str]) -> Path:
    """A cached layer as atelet unpacks one: ``fs/`` and its ``whiteouts.json``."""
    layer = root / "layers" / name
    fs = layer / "fs"
    fs.mkdir(parents=True)
    for path, text in files.items():
        target = fs / path
        if path.endswith("/"):
            target.mkdir(parents=True, exist_ok=True)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    if record:
        (layer / "whiteouts.json").write_text(json.dumps({"version": 1, **record}))
    return layer


def _spec(container: Path, layers: list[Path], **extra: object) -> None:
    container.mkdir(parents=True, exist_ok=True)
    doc = {"version": 1, "layers": [str(p) for p in layers], **extra}
    (container / overlay.OVERLAY_SPEC).write_text(json.dumps(doc))


@pytest.fixture
def world(tmp_path: Path, require_root: None) -> Iterator[Path]:
    yield tmp_path
    overlay.unmount_all_under(tmp_path)
    assert overlay.mount_points_under(tmp_path) == []


def _compose(container: Path, layers_dir: Path) -> overlay.OverlaySpec:
    spec = overlay.read_overlay_spec(container, layers_dir=layers_dir)
    assert spec is not None
    overlay.compose_rootfs(container, spec)
    return spec


def test_the_merged_view_is_the_image_with_whiteouts_opaques_and_a_private_upper(
    world: Path,
) -> None:
    base = _layer(
        world,
        "base",
        {"etc/os-release": "base", "etc/gone": "x", "cache/old": "x", "bin/tool": "v1"},
    )
    top = _layer(
        world,
        "top",
        {"bin/tool": "v2", "cache/new": "y"},
        whiteouts=["etc/gone"],
        opaques=["cache"],
    )
    container = world / "bundle" / "app"
    _spec(container, [base, top], extraDirs=["/run/identity"])
    _compose(container, world / "layers")
    rootfs = container / "rootfs"
    assert str(rootfs) in overlay.mount_points_under(world)
    assert (rootfs / "etc/os-release").read_text() == "base"
    assert (rootfs / "bin/tool").read_text() == "v2"  # the top layer wins
    assert not (rootfs / "etc/gone").exists()  # whited out
    assert sorted(os.listdir(rootfs / "cache")) == ["new"]  # opaque: the lower's hidden
    assert (rootfs / "run/identity").is_dir()
    # Writes land in the bundle's private upper, never in a shared layer.
    (rootfs / "etc/os-release").write_text("changed")
    assert (container / "upper/etc/os-release").read_text() == "changed"
    assert (base / "fs/etc/os-release").read_text() == "base"
    assert (container / "upper/run/identity").is_dir()
    # The layer was finalised once: its marker, a 0:0 whiteout device, the opaque xattr.
    assert (top / "finalized").exists()
    st = os.lstat(top / "fs/etc/gone")
    assert stat.S_ISCHR(st.st_mode) and st.st_rdev == 0
    assert os.getxattr(top / "fs/cache", "trusted.overlay.opaque") == b"y"

    assert overlay.unmount_all_under(container) == [str(rootfs)]
    assert overlay.mount_points_under(world) == []
    assert not (rootfs / "etc").exists()


def test_composing_again_replaces_a_stale_mount(world: Path) -> None:
    base = _layer(world, "base", {"a": "1"})
    container = world / "bundle" / "app"
    _spec(container, [base])
    _compose(container, world / "layers")
    _compose(container, world / "layers")  # a failed earlier activation's mount is detached
    table = Path("/proc/self/mountinfo").read_text().splitlines()
    points = [p for p in table if str(container) in p]
    assert len(points) == 1


def test_an_implicit_parent_does_not_shadow_a_declared_directory(world: Path) -> None:
    base = _layer(world, "base", {"tmp/": ""})
    os.chmod(base / "fs/tmp", 0o1777)
    top = _layer(world, "top", {"tmp/made-by-top": "x"}, implicitDirs=["tmp"])
    os.chmod(top / "fs/tmp", 0o755)
    container = world / "bundle" / "app"
    _spec(container, [base, top])
    _compose(container, world / "layers")
    assert stat.S_IMODE(os.stat(container / "rootfs/tmp").st_mode) == 0o1777
    assert stat.S_IMODE(os.stat(top / "fs/tmp").st_mode) == 0o755  # the layer is untouched


def test_a_layer_listed_twice_is_mounted_once(world: Path) -> None:
    base = _layer(world, "base", {"a": "1"})
    top = _layer(world, "top", {"b": "2"})
    container = world / "bundle" / "app"
    _spec(container, [base, top, base])
    _compose(container, world / "layers")
    assert (container / "rootfs/a").read_text() == "1"


def test_image_volumes_are_read_only(world: Path) -> None:
    base = _layer(world, "base", {"a": "1"})
    one = _layer(world, "models", {"weights": "w"})
    two = _layer(world, "data2", {"more": "m"})
    container = world / "bundle" / "app"
    _spec(
        container,
        [base],
        imageVolumes=[
            {"name": "models", "layers": [str(one)]},
            {"name": "both", "layers": [str(one), str(two)]},
        ],
    )
    _compose(container, world / "layers")
    assert (container / "volumes/models/weights").read_text() == "w"
    assert sorted(os.listdir(container / "volumes/both")) == ["more", "weights"]
    for name in ("models", "both"):
        with pytest.raises(OSError, match="Read-only file system"):
            (container / "volumes" / name / "new").write_text("x")
    overlay.unmount_all_under(container)
    assert overlay.mount_points_under(world) == []


def test_no_spec_leaves_the_rootfs_alone(tmp_path: Path) -> None:
    container = tmp_path / "app"
    (container / "rootfs").mkdir(parents=True)
    assert overlay.read_overlay_spec(container) is None


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"version": 2, "layers": []}, "version 2, want 1"),
        ({"version": 1, "layers": ["/etc"]}, "not under the image layers directory"),
        ({"version": 1, "layers": ["relative/layer"]}, "not an absolute, normalised path"),
        ({"version": 1, "layers": ["{L}/../../etc"]}, "not an absolute, normalised path"),
        ({"version": 1, "layers": [], "extraDirs": ["/a/../../x"]}, "escapes the rootfs"),
        (
            {"version": 1, "layers": [], "imageVolumes": [{"name": "../x", "layers": []}]},
            "not a plain name",
        ),
        ({"version": 1, "layers": "oops"}, "layers must be a list"),
    ],
)
def test_a_bad_spec_is_refused_naming_the_field(
    tmp_path: Path, doc: dict[str, object], message: str
) -> None:
    layers_dir = tmp_path / "layers"
    container = tmp_path / "app"
    container.mkdir()
    text = json.dumps(doc).replace("{L}", str(layers_dir))
    (container / overlay.OVERLAY_SPEC).write_text(text)
    with pytest.raises(overlay.OverlayError, match=message) as caught:
        overlay.read_overlay_spec(container, layers_dir=layers_dir)
    assert caught.value.bad_input
    assert str(container / overlay.OVERLAY_SPEC) in str(caught.value)


def test_a_fifo_spec_is_refused_at_once(tmp_path: Path) -> None:
    container = tmp_path / "app"
    container.mkdir()
    os.mkfifo(container / overlay.OVERLAY_SPEC)
    with pytest.raises(overlay.OverlayError, match="refusing"):
        overlay.read_overlay_spec(container)


def test_a_symlinked_mount_point_is_refused_never_mounted_through(world: Path) -> None:
    base = _layer(world, "base", {"a": "1"})
    elsewhere = world / "elsewhere"
    elsewhere.mkdir()
    container = world / "bundle" / "app"
    _spec(container, [base])
    (container / "rootfs").symlink_to(elsewhere)
    spec = overlay.read_overlay_spec(container, layers_dir=world / "layers")
    assert spec is not None
    with pytest.raises(overlay.OverlayError, match="symbolic link"):
        overlay.compose_rootfs(container, spec)
    assert overlay.mount_points_under(world) == []
    assert os.listdir(elsewhere) == []


def _linked_elsewhere(world: Path, container: Path) -> Path:
    """Move ``container`` aside (inside its bundle) and put in its place a link to a
    directory elsewhere holding the same spec: what a party racing the worker would do."""
    elsewhere = world / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / overlay.OVERLAY_SPEC).write_bytes((container / overlay.OVERLAY_SPEC).read_bytes())
    container.rename(container.with_name(container.name + ".moved"))
    container.symlink_to(elsewhere)
    return elsewhere


def test_a_container_directory_that_is_a_link_is_refused_never_read_or_composed_through(
    world: Path,
) -> None:
    """``<bundle>/app`` a link to a directory elsewhere: neither the spec is read through it
    nor anything composed there (issue 30 §3: no link followed under the bundle directory)."""
    base = _layer(world, "base", {"a": "1"})
    container = world / "bundle" / "app"
    _spec(container, [base])
    elsewhere = _linked_elsewhere(world, container)
    with pytest.raises(overlay.OverlayError, match="symbolic link") as caught:
        overlay.read_overlay_spec(container, layers_dir=world / "layers")
    assert caught.value.bad_input
    with pytest.raises(overlay.OverlayError, match="symbolic link"):
        overlay.compose_bundle(world / "bundle", ("app",), layers_dir=world / "layers")
    assert os.listdir(elsewhere) == [overlay.OVERLAY_SPEC]
    assert overlay.mount_points_under(world) == []


def test_a_link_swapped_in_after_the_spec_was_read_is_never_composed_through(
    world: Path,
) -> None:
    """The spec was read (the request checked), then the container directory became a link
    elsewhere: the compose refuses it, and nothing is made or mounted there."""
    base = _layer(world, "base", {"a": "1"})
    container = world / "bundle" / "app"
    _spec(container, [base])
    spec = overlay.read_overlay_spec(container, layers_dir=world / "layers")
    assert spec is not None
    elsewhere = _linked_elsewhere(world, container)
    with pytest.raises(overlay.OverlayError, match="symbolic link"):
        overlay.compose_rootfs(container, spec)
    assert os.listdir(elsewhere) == [overlay.OVERLAY_SPEC]
    assert overlay.mount_points_under(world) == []


def test_a_link_swapped_in_while_a_bundle_is_composed_is_not_followed(
    world: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The container directory becomes a link once its spec is read (the first layer is
    being finalized): the rootfs is composed in the directory the spec came from, through
    the descriptor opened once, never at the link's target."""
    base = _layer(world, "base", {"a": "1"})
    container = world / "bundle" / "app"
    _spec(container, [base])
    finalize = overlay.finalize_layer
    swapped: list[Path] = []

    def swap_then_finalize(layer: Path) -> None:
        if not swapped:
            swapped.append(_linked_elsewhere(world, container))
        finalize(layer)

    monkeypatch.setattr(overlay, "finalize_layer", swap_then_finalize)
    assert overlay.compose_bundle(world / "bundle", ("app",), layers_dir=world / "layers") == (
        "app",
    )
    (elsewhere,) = swapped
    assert os.listdir(elsewhere) == [overlay.OVERLAY_SPEC]
    moved = world / "bundle" / "app.moved"
    assert overlay.mount_points_under(world) == [str(moved / "rootfs")]
    assert (moved / "rootfs" / "a").read_text() == "1"


def test_an_extra_dir_through_an_image_symlink_stays_in_the_rootfs(world: Path) -> None:
    base = _layer(world, "base", {"data/": ""})
    (base / "fs/run").symlink_to("/data")  # resolved in the rootfs: <rootfs>/data
    container = world / "bundle" / "app"
    _spec(container, [base], extraDirs=["/run/identity"])
    _compose(container, world / "layers")
    assert (container / "rootfs/data/identity").is_dir()
    assert (container / "upper/data/identity").is_dir()


def test_an_extra_dir_through_a_link_to_the_host_is_refused(world: Path) -> None:
    host = world / "host"
    host.mkdir()
    base = _layer(world, "base", {"etc/": ""})
    (base / "fs/run").symlink_to(host)  # a host path, absent inside the rootfs
    container = world / "bundle" / "app"
    _spec(container, [base], extraDirs=["/run/identity"])
    spec = overlay.read_overlay_spec(container, layers_dir=world / "layers")
    assert spec is not None
    with pytest.raises(overlay.OverlayError, match="nothing was written there"):
        overlay.compose_rootfs(container, spec)
    assert os.listdir(host) == []
    assert overlay.mount_points_under(world) == []  # the failed compose detached its mount


def test_a_whiteout_escaping_its_layer_is_refused_before_any_mknod(world: Path) -> None:
    evil = _layer(world, "evil", {"a": "1"}, whiteouts=["../../../outside"])
    container = world / "bundle" / "app"
    _spec(container, [evil])
    spec = overlay.read_overlay_spec(container, layers_dir=world / "layers")
    assert spec is not None
    with pytest.raises(overlay.OverlayError, match="not a local path"):
        overlay.compose_rootfs(container, spec)
    assert not (world / "outside").exists()
    assert not (evil / "finalized").exists()


def test_mountinfo_escapes_are_read(tmp_path: Path) -> None:
    line = r"36 35 0:40 / /tmp/a\040b/rootfs rw - overlay overlay rw"
    assert overlay.mount_points_under("/tmp/a b", line + "\n") == ["/tmp/a b/rootfs"]
    assert overlay.mount_points_under("/tmp/a", line + "\n") == []
