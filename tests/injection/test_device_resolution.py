"""Resolving device numbers against the host, and detecting a worker's GPUs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from substrate_gpu import exceptions
from substrate_gpu.cdi import model
from substrate_gpu.injection import devices


@pytest.fixture
def dev_root(tmp_path: Path) -> Path:
    """A host tree whose dev/ holds real char devices (symlinks to /dev/null, 1:3)."""
    (tmp_path / "dev").mkdir()
    for name in ("nvidia0", "nvidiactl"):
        (tmp_path / "dev" / name).symlink_to("/dev/null")
    (tmp_path / "dev" / "regular").write_text("")
    return tmp_path


def test_unset_numbers_come_from_the_host(dev_root):
    """A node without major/minor gets the host node's type and numbers."""
    resolved = devices.resolve_device(model.DeviceNode("/dev/nvidia0"), dev_root=dev_root)
    assert (resolved.type, resolved.major, resolved.minor) == ("c", 1, 3)
    assert resolved.permissions == "rwm"


def test_nonzero_major_in_spec_is_kept(dev_root):
    """major: 195 with minor omitted means 195:0, whatever the host has."""
    node = model.DeviceNode("/dev/nvidia0", major=195)
    resolved = devices.resolve_device(node, dev_root=dev_root)
    assert (resolved.type, resolved.major, resolved.minor) == ("c", 195, 0)


def test_complete_node_needs_no_host_node(tmp_path):
    """Type and a non-zero major given: the node is taken as written, never stat-ed."""
    node = model.DeviceNode("/dev/nvidia7", type="c", major=195, minor=7)
    resolved = devices.resolve_device(node, dev_root=tmp_path)
    assert (resolved.type, resolved.major, resolved.minor, resolved.file_mode) == (
        "c",
        195,
        7,
        None,
    )


def test_major_without_type_needs_the_host_node(tmp_path):
    """No type: the host is stat-ed even with major given, so a missing node is an error."""
    node = model.DeviceNode("/dev/nvidia7", major=195, minor=7)
    with pytest.raises(exceptions.DeviceResolutionError, match=r"/dev/nvidia7.*cannot stat"):
        devices.resolve_device(node, dev_root=tmp_path)


@pytest.mark.parametrize(
    ("node", "expected"),
    [
        # nvidia-ctk >= 1.19 writes major and no type: the host gives type and mode.
        pytest.param(
            model.DeviceNode("/dev/nvidia0", major=195), ("c", 195, 0, 0o640), id="major-no-type"
        ),
        pytest.param(model.DeviceNode("/dev/nvidia0"), ("c", 1, 3, 0o640), id="nothing-given"),
        pytest.param(
            model.DeviceNode("/dev/nvidia0", major=195, minor=3, file_mode=0o600),
            ("c", 195, 3, 0o600),
            id="spec-mode-wins",
        ),
        # A complete node keeps its type and numbers, and still takes the host's mode (as the
        # reference's fillMissingInfo does, for runtimes that bind-mount device nodes).
        pytest.param(
            model.DeviceNode("/dev/nvidia0", type="c", major=195),
            ("c", 195, 0, 0o640),
            id="complete",
        ),
        pytest.param(
            model.DeviceNode("/dev/nvidia0", type="p"), ("p", 0, 0, 0o640), id="complete-fifo"
        ),
    ],
)
def test_file_mode_comes_from_the_host_when_the_spec_has_none(
    require_root, tmp_path, node, expected
):
    """fileMode from the host node when the spec gives none, even for a complete node."""
    (tmp_path / "dev").mkdir()
    target = tmp_path / "dev" / "nvidia0"
    os.mknod(target, 0o640 | 0o020000, os.makedev(1, 3))
    target.chmod(0o640)
    resolved = devices.resolve_device(node, dev_root=tmp_path)
    assert (resolved.type, resolved.major, resolved.minor, resolved.file_mode) == expected


@pytest.mark.parametrize(
    "node",
    [
        pytest.param(model.DeviceNode("/dev/fifo"), id="type-from-host"),
        pytest.param(model.DeviceNode("/dev/fifo", type="p"), id="type-given"),
    ],
)
def test_fifo_has_no_numbers(tmp_path, node):
    """A FIFO resolves to type p with 0:0 (it will get no cgroup rule)."""
    (tmp_path / "dev").mkdir()
    os.mkfifo(tmp_path / "dev" / "fifo", 0o600)
    resolved = devices.resolve_device(node, dev_root=tmp_path)
    assert (resolved.type, resolved.major, resolved.minor) == ("p", 0, 0)


def test_zero_major_is_resolved_on_the_host(dev_root):
    """major: 0 is 'unset' (CDI delegates to the runtime) and is stat-ed."""
    node = model.DeviceNode("/dev/nvidia0", major=0, minor=0)
    assert devices.resolve_device(node, dev_root=dev_root).major == 1


def test_host_path_is_used_for_the_stat(dev_root):
    """hostPath, not path, names the node on the host."""
    node = model.DeviceNode("/dev/gpu", host_path="/dev/nvidiactl")
    resolved = devices.resolve_device(node, dev_root=dev_root)
    assert (resolved.path, resolved.major) == ("/dev/gpu", 1)


def test_missing_node_is_a_clear_error(dev_root):
    """A node the host lacks fails, naming the node and the host path."""
    with pytest.raises(exceptions.DeviceResolutionError, match=r"/dev/nvidia3.*cannot stat"):
        devices.resolve_device(model.DeviceNode("/dev/nvidia3"), dev_root=dev_root)


def test_regular_file_is_not_a_device(dev_root):
    """A regular file where a device should be is refused."""
    with pytest.raises(exceptions.DeviceResolutionError, match="not a device node"):
        devices.resolve_device(model.DeviceNode("/dev/regular"), dev_root=dev_root)


def test_type_mismatch_is_refused(dev_root):
    """A spec saying 'b' for a char device is refused."""
    with pytest.raises(exceptions.DeviceResolutionError, match="type 'b'"):
        devices.resolve_device(model.DeviceNode("/dev/nvidia0", type="b"), dev_root=dev_root)


def test_duplicates_are_resolved_once_first_wins(dev_root):
    """Nodes repeated by spec-level and device edits appear once, in spec order."""
    nodes = [
        model.DeviceNode("/dev/nvidiactl"),
        model.DeviceNode("/dev/nvidia0"),
        model.DeviceNode("/dev/nvidiactl", major=195, minor=255),
    ]
    resolved = devices.resolve_device_numbers(nodes, dev_root=dev_root)
    assert [(d.path, d.major) for d in resolved] == [("/dev/nvidiactl", 1), ("/dev/nvidia0", 1)]


def test_real_mknod_numbers(require_root, tmp_path):
    """A real mknod'ed 195:3 node resolves to exactly 195:3."""
    (tmp_path / "dev").mkdir()
    os.mknod(tmp_path / "dev/nvidia3", 0o666 | 0o020000, os.makedev(195, 3))
    resolved = devices.resolve_device(model.DeviceNode("/dev/nvidia3"), dev_root=tmp_path)
    assert (resolved.type, resolved.major, resolved.minor) == ("c", 195, 3)


@pytest.mark.parametrize(
    ("names", "expected"),
    [
        pytest.param(["nvidia0"], ("/dev/nvidia0",), id="one"),
        # A worker on a shared node may hold nvidia2 and nvidia3 and no nvidia0.
        pytest.param(
            ["nvidia3", "nvidia2", "nvidiactl"], ("/dev/nvidia2", "/dev/nvidia3"), id="no-nvidia0"
        ),
        pytest.param(
            ["nvidia10", "nvidia9"], ("/dev/nvidia9", "/dev/nvidia10"), id="numeric-order"
        ),
        pytest.param(["nvidiactl", "nvidia-uvm", "nvidia-caps"], (), id="control-nodes-only"),
        pytest.param([], (), id="none"),
    ],
)
def test_gpu_detection(tmp_path, names, expected):
    """GPU present ⇔ any /dev/nvidia[0-9]* exists under the dev root."""
    (tmp_path / "dev").mkdir()
    for name in names:
        (tmp_path / "dev" / name).write_text("")
    assert devices.detect_gpus(tmp_path) == expected
    assert devices.has_gpu(tmp_path) is bool(expected)


def test_gpu_detection_without_dev_dir(tmp_path):
    """A dev root without dev/ holds no GPU."""
    assert not devices.has_gpu(tmp_path)


def test_a_complete_node_absent_from_the_host_is_taken_as_written(tmp_path):
    """A vendor may describe a node fully: no host node is then no error (and no mode)."""
    (tmp_path / "dev").mkdir()
    node = model.DeviceNode("/dev/vendorctl", type="c", major=240, minor=2)
    resolved = devices.resolve_device(node, dev_root=tmp_path)
    assert (resolved.type, resolved.major, resolved.minor, resolved.file_mode) == (
        "c",
        240,
        2,
        None,
    )
