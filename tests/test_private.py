"""``substrate_gpu._private``: checkpoint image directories 0700 and image files 0600,
whatever the umask (here the usual 022, under which runsc's own modes are 0755 and 0644)."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest
from support.umask import umask

from substrate_gpu import _private


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


@pytest.fixture(autouse=True)
def _umask_022():
    with umask(0o022):
        yield


def test_each_directory_made_is_0700(tmp_path: Path) -> None:
    image = tmp_path / "checkpoints" / "a1" / "7"
    _private.make_private_dirs(image)
    assert [_mode(p) for p in (image.parent.parent, image.parent, image)] == [0o700] * 3


def test_0700_even_under_a_umask_that_takes_owner_bits(tmp_path: Path) -> None:
    with umask(0o277):
        _private.make_private_dirs(tmp_path / "image")
    assert _mode(tmp_path / "image") == 0o700


def test_a_directory_that_exists_keeps_its_mode(tmp_path: Path) -> None:
    """The caller's directory (atelet's checkpoint_dir) is not ours to chmod."""
    given = tmp_path / "checkpoint"
    given.mkdir(mode=0o755)
    _private.make_private_dirs(given / "sub")
    assert (_mode(given), _mode(given / "sub")) == (0o755, 0o700)


def test_image_files_lose_their_group_and_other_bits(tmp_path: Path) -> None:
    for name, mode in (("checkpoint.img", 0o644), ("pages.img", 0o666), ("run.sh", 0o755)):
        (tmp_path / name).write_bytes(b"memory")
        (tmp_path / name).chmod(mode)
    _private.make_files_private(tmp_path)
    assert {p.name: _mode(p) for p in tmp_path.iterdir()} == {
        "checkpoint.img": 0o600,
        "pages.img": 0o600,
        "run.sh": 0o700,
    }


def test_a_link_in_the_image_directory_is_not_followed(tmp_path: Path) -> None:
    """A symlink to a host file: the host file keeps its mode."""
    host = tmp_path / "host-file"
    host.write_text("x")
    host.chmod(0o644)
    (tmp_path / "image").mkdir()
    (tmp_path / "image" / "link").symlink_to(host)
    _private.make_files_private(tmp_path / "image")
    assert _mode(host) == 0o644


def test_a_fifo_in_the_image_directory_is_skipped_at_once(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo", 0o644)
    worker = threading.Thread(target=_private.make_files_private, args=(tmp_path,), daemon=True)
    worker.start()
    worker.join(10)
    assert not worker.is_alive(), "make_files_private blocked on a FIFO"
    assert _mode(tmp_path / "fifo") == 0o644


def test_no_image_directory_is_nothing_to_do(tmp_path: Path) -> None:
    _private.make_files_private(tmp_path / "never-made")
