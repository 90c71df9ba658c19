"""Durable-dir volumes (:mod:`substrate_gpu.service.durable_dirs`): their binds, their tars,
and the rules a restored tar must keep (upstream's ``durable.go`` at 533900d, stricter where
the tar is the actor's data landing on the host)."""

from __future__ import annotations

import io
import os
import re
import socket
import stat
import tarfile
from pathlib import Path

import pytest

from substrate_gpu.service import durable_dirs as dd

VOLUMES = "durable"


@pytest.mark.parametrize(
    ("volume", "ok"),
    [
        pytest.param("data", True, id="plain"),
        pytest.param("my.vol-1", True, id="dots-and-dashes"),
        pytest.param("", False, id="empty"),
        pytest.param(".", False, id="dot"),
        pytest.param("..", False, id="dot-dot: out of the volumes directory"),
        pytest.param("a/b", False, id="slash: not one entry"),
        pytest.param("/abs", False, id="absolute"),
    ],
)
def test_a_volume_name_must_be_one_directory_entry(volume, ok):
    if ok:
        assert dd.tar_name(volume) == f"durable-dir-{volume}.tar"
    else:
        with pytest.raises(dd.DurableDirError, match="invalid durable-dir volume name"):
            dd.tar_name(volume)


@pytest.mark.parametrize(
    ("pairs", "message"),
    [
        pytest.param([("../x", "/data")], "durable_dir_volume_mounts[0].volume_name", id="name"),
        pytest.param([("data", "data")], "mount_path 'data' is not an absolute", id="relative"),
        pytest.param([("data", "/a/../b")], "is not an absolute, clean", id="unclean"),
        pytest.param([("data", "/")], "below /", id="root"),
        pytest.param([("a", "/d"), ("b", "/d")], "mounted twice", id="twice"),
    ],
)
def test_a_bad_mount_is_refused_naming_its_field(pairs, message):
    with pytest.raises(dd.DurableDirError, match=re.escape(message)) as caught:
        dd.check_mounts([("app", pairs)])
    assert str(caught.value).startswith("spec.containers[0].durable_dir_volume_mounts[")


def test_volume_names_are_sorted_and_once_each():
    mounts = dd.check_mounts([("app", [("b", "/b"), ("a", "/a")]), ("side", [("a", "/shared")])])
    assert dd.volume_names(mounts) == ("a", "b")


def test_the_bind_is_atelets_and_added_once(tmp_path):
    """A config without the bind gets atelet's (``bind,rw`` of the volume's directory); a
    config with it is left as it is (None: nothing to write)."""
    [mount] = dd.check_mounts([("app", [("data", "/home/counter")])])
    config: dict[str, object] = {"mounts": [{"destination": "/proc", "type": "proc"}]}
    updated = dd.with_mounts(config, [mount], tmp_path)
    assert updated is not None
    assert updated["mounts"][-1] == {
        "destination": "/home/counter",
        "type": "bind",
        "source": str(tmp_path / "data"),
        "options": ["bind", "rw"],
    }
    assert config["mounts"] == [{"destination": "/proc", "type": "proc"}]  # not mutated
    assert dd.with_mounts(updated, [mount], tmp_path) is None


def test_another_mount_at_the_destination_is_replaced(tmp_path):
    [mount] = dd.check_mounts([("app", [("data", "/data")])])
    config = {"mounts": [{"destination": "/data", "type": "tmpfs", "source": "tmpfs"}]}
    updated = dd.with_mounts(config, [mount], tmp_path)
    assert updated is not None
    assert [m["source"] for m in updated["mounts"]] == [str(tmp_path / "data")]


def _volume(tmp_path: Path, name: str = "data") -> Path:
    volume = tmp_path / VOLUMES / name
    volume.mkdir(parents=True)
    return volume


def _names(tar_path: Path) -> list[str]:
    with tarfile.open(tar_path) as tar:
        return sorted(tar.getnames())


def test_an_archive_holds_the_tree_and_not_gvisors_files(tmp_path):
    volume = _volume(tmp_path)
    (volume / "sub").mkdir()
    (volume / "sub" / "count").write_text("41")
    (volume / ".gvisor.filestore.123").write_bytes(b"x" * 10)
    (volume / "link").symlink_to("/etc/passwd")  # the sandbox's own link, kept as a link
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(volume / "app.sock"))
    out = tmp_path / "ckpt"
    out.mkdir()
    try:
        assert dd.archive(tmp_path / VOLUMES, out, ["data"]) == ["durable-dir-data.tar"]
    finally:
        sock.close()
    tar_path = out / "durable-dir-data.tar"
    assert _names(tar_path) == [".", "./link", "./sub", "./sub/count"]
    assert stat.S_IMODE(tar_path.stat().st_mode) == 0o600
    assert sorted(p.name for p in out.iterdir()) == ["durable-dir-data.tar"]  # no partial


def test_a_volume_that_is_a_symlink_is_refused(tmp_path):
    (tmp_path / VOLUMES).mkdir()
    (tmp_path / VOLUMES / "data").symlink_to("/etc")
    with pytest.raises(dd.DurableDirError, match="is a symbolic link"):
        dd.archive(tmp_path / VOLUMES, tmp_path, ["data"])
    with pytest.raises(dd.DurableDirError, match="is a symbolic link"):
        dd.volume_dir(tmp_path / VOLUMES, "data", create=True)


def test_extract_restores_what_archive_saved(tmp_path):
    """Contents, modes (the sticky bit and group write too), owners and links come back;
    a volume with no tar in the snapshot stays empty."""
    volume = _volume(tmp_path)
    (volume / "shared").mkdir(mode=0o777)
    os.chmod(volume / "shared", 0o1777)
    (volume / "shared" / "f").write_text("data")
    os.chmod(volume / "shared" / "f", 0o664)
    os.chown(volume / "shared" / "f", 1234, 5678)
    (volume / "rel").symlink_to("shared/f")
    os.link(volume / "shared" / "f", volume / "hard")
    snapshot = tmp_path / "snap"
    snapshot.mkdir()
    dd.archive(tmp_path / VOLUMES, snapshot, ["data"])

    fresh = tmp_path / "fresh"
    fresh.mkdir()
    assert dd.extract(snapshot, fresh, ["data", "added-since"]) == ["durable-dir-data.tar"]
    restored = fresh / "data"
    assert (restored / "shared" / "f").read_text() == "data"
    assert stat.S_IMODE((restored / "shared").stat().st_mode) == 0o1777
    info = (restored / "shared" / "f").stat()
    assert (stat.S_IMODE(info.st_mode), info.st_uid, info.st_gid) == (0o664, 1234, 5678)
    assert os.readlink(restored / "rel") == "shared/f"
    assert (restored / "hard").stat().st_ino == info.st_ino
    assert not (fresh / "added-since").exists()


def _tar_of(tmp_path: Path, *members: tuple[tarfile.TarInfo, bytes]) -> Path:
    snapshot = tmp_path / "snap"
    snapshot.mkdir(exist_ok=True)
    with tarfile.open(snapshot / "durable-dir-data.tar", "w") as tar:
        for info, data in members:
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data else None)
    return snapshot


def _member(name: str, kind: bytes = tarfile.REGTYPE, **attrs: object) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.mode = 0o644
    for key, value in attrs.items():
        setattr(info, key, value)
    return info


@pytest.mark.parametrize(
    "members",
    [
        pytest.param([(_member("../escape"), b"x")], id="dot-dot"),
        pytest.param(
            [(_member("etc", tarfile.SYMTYPE, linkname="/etc"), b""), (_member("etc/x"), b"x")],
            id="through-a-planted-symlink",
        ),
        pytest.param(
            [(_member("passwd", tarfile.LNKTYPE, linkname="../../../../etc/passwd"), b"")],
            id="hard-link-to-a-host-file",
        ),
        pytest.param([(_member("null", tarfile.CHRTYPE, devmajor=1, devminor=3), b"")], id="dev"),
        pytest.param([(_member("fifo", tarfile.FIFOTYPE), b"")], id="fifo"),
    ],
)
def test_a_tar_breaking_a_rule_refuses_the_restore(tmp_path, members):
    """Nothing lands outside the volume, and no device node or FIFO is made on the host."""
    snapshot = _tar_of(tmp_path, *members)
    with pytest.raises(dd.DurableDirError, match="while restoring durable-dir volume 'data'"):
        dd.extract(snapshot, tmp_path / VOLUMES, ["data"])
    assert not (tmp_path / "escape").exists()


def test_a_restore_drops_set_id_bits_and_gvisors_files(tmp_path):
    snapshot = _tar_of(
        tmp_path,
        (_member("tool", mode=0o4755), b"#!/bin/sh\n"),
        (_member("sub/.gvisor.filestore.1"), b"x"),
    )
    dd.extract(snapshot, tmp_path / VOLUMES, ["data"])
    volume = tmp_path / VOLUMES / "data"
    assert stat.S_IMODE((volume / "tool").stat().st_mode) == 0o755
    assert list((volume / "sub").iterdir()) == []


def test_apply_mounts_makes_the_volume_directories_and_writes_the_binds(tmp_path):
    from substrate_gpu.testing import bundles

    bundles.make_bundle(tmp_path / "b" / "app", ["true"])
    mounts = dd.check_mounts([("app", [("data", "/data")])])
    dd.apply_mounts(tmp_path / "b", mounts, tmp_path / VOLUMES)
    assert stat.S_IMODE((tmp_path / VOLUMES / "data").stat().st_mode) == 0o700
    import json

    config = json.loads((tmp_path / "b" / "app" / "config.json").read_text())
    assert config["mounts"][-1]["source"] == str(tmp_path / VOLUMES / "data")
