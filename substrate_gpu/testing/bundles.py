"""Small OCI bundles for actors on a simulated node: a static busybox rootfs.

The config is what ``runc spec`` writes (runc 1.1), with ``terminal`` off and a writable
root, so a bundle runs under real runc in tests and in the demo. The image may carry its
own ``env`` (an image that sets ``NVIDIA_VISIBLE_DEVICES`` and ``LD_LIBRARY_PATH`` is the
interesting case for injection).
"""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

from substrate_gpu import exceptions
from substrate_gpu.injection import oci_bodies

BUSYBOX_CANDIDATES = ("/bin/busybox", "/usr/bin/busybox")

_RUNC_SPEC: oci_bodies.Config = {
    "ociVersion": "1.0.2-dev",
    "process": {
        "terminal": False,
        "user": {"uid": 0, "gid": 0},
        "args": ["sh"],
        "env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
        "cwd": "/",
        "capabilities": {
            k: ["CAP_AUDIT_WRITE", "CAP_KILL", "CAP_NET_BIND_SERVICE"]
            for k in ("bounding", "effective", "permitted", "ambient")
        },
        "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 1024, "soft": 1024}],
        "noNewPrivileges": True,
    },
    "root": {"path": "rootfs", "readonly": False},
    "hostname": "actor",
    "mounts": [
        {"destination": "/proc", "type": "proc", "source": "proc"},
        {
            "destination": "/dev",
            "type": "tmpfs",
            "source": "tmpfs",
            "options": ["nosuid", "strictatime", "mode=755", "size=65536k"],
        },
        {
            "destination": "/dev/pts",
            "type": "devpts",
            "source": "devpts",
            "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"],
        },
        {
            "destination": "/dev/shm",  # noqa: S108  (a mount destination, not a temp file)
            "type": "tmpfs",
            "source": "shm",
            "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"],
        },
        {
            "destination": "/sys",
            "type": "sysfs",
            "source": "sysfs",
            "options": ["nosuid", "noexec", "nodev", "ro"],
        },
    ],
    "linux": {
        "resources": {"devices": [{"allow": False, "access": "rwm"}]},
        "namespaces": [
            {"type": "pid"},
            {"type": "network"},
            {"type": "ipc"},
            {"type": "uts"},
            {"type": "mount"},
        ],
        "maskedPaths": ["/proc/kcore", "/proc/keys", "/sys/firmware"],
        "readonlyPaths": ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys"],
    },
}


def find_busybox() -> Path:
    """A static busybox to populate rootfs ``/bin``."""
    for candidate in BUSYBOX_CANDIDATES:
        if Path(candidate).is_file():
            return Path(candidate)
    raise exceptions.ConfigError(
        "while building an actor bundle: no static busybox found "
        f"(looked at {', '.join(BUSYBOX_CANDIDATES)}); install busybox-static"
    )


#: Applets linked into the rootfs's /bin, so a bundle's args can say ``sh`` or ``sleep``.
APPLETS = (
    "sh", "cat", "env", "stat", "ls", "readlink", "grep", "sleep", "echo", "true", "false",
)  # fmt: skip


def make_busybox_rootfs(rootfs: Path) -> Path:
    """``rootfs`` with a static busybox, links for common applets, and the mount points."""
    bin_dir = rootfs / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    shutil.copy2(find_busybox(), bin_dir / "busybox")
    for applet in APPLETS:
        link = bin_dir / applet
        if not link.is_symlink():
            link.symlink_to("busybox")
    for name in ("proc", "dev", "sys", "tmp"):
        (rootfs / name).mkdir(exist_ok=True)
    return rootfs


def runc_spec() -> oci_bodies.Config:
    """A fresh copy of the default config."""
    return copy.deepcopy(_RUNC_SPEC)


def make_bundle(
    directory: Path,
    args: list[str],
    *,
    env: list[str] | None = None,
    annotations: dict[str, str] | None = None,
) -> Path:
    """Create ``directory`` as an OCI bundle running ``args`` in a busybox rootfs."""
    make_busybox_rootfs(directory / "rootfs")
    config = runc_spec()
    process = config["process"]
    process["args"] = list(args)
    if env is not None:
        process["env"] = list(env)
    if annotations:
        config["annotations"] = dict(annotations)
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return directory
