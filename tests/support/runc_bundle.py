"""Tiny OCI bundles for real ``runc`` in tests: a static busybox rootfs and a config.json.

``make_busybox_bundle`` starts from what ``runc spec`` writes (so the config is the one runc
itself considers default for its version) and edits only what tests need: the process,
no terminal, extra env, and device nodes with their cgroup allow rules. Device nodes are
the way to give a container "a GPU" on a machine without one: ``/dev/nvidia0`` as a (1,3)
char device (``/dev/null``) reads and writes like null, and its fd link in
``/proc/<pid>/fd`` reads ``/dev/nvidia0`` from the host, exactly as a real GPU node would.

``run_to_completion`` runs a bundle in runc and returns what it printed; ``delete_all``
force-deletes every container under a runc root, for fixture teardown.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from substrate_gpu.testing import bundles


@dataclass(frozen=True)
class DeviceNode:
    """A device node created in the container (``linux.devices``) and allowed in its cgroup."""

    path: str
    """Path inside the container, e.g. ``/dev/nvidia0``."""
    major: int = 1
    """Major number; (1,3) is ``/dev/null``, harmless stand-in for a GPU node."""
    minor: int = 3
    """Minor number."""
    type: str = "c"
    """``c`` (char) or ``b`` (block)."""
    file_mode: int = 0o666
    """Permissions of the node."""


def make_busybox_bundle(
    directory: Path,
    args: Sequence[str],
    *,
    env: Sequence[str] = (),
    devices: Sequence[DeviceNode] = (),
    binds: Sequence[tuple[Path, str]] = (),
    runc: str = "runc",
) -> Path:
    """Create an OCI bundle in ``directory`` running ``args`` with busybox; return it.

    The rootfs holds the static ``/bin/busybox`` and links for common applets; the config
    is ``runc spec``'s with ``terminal: false`` (tests run without a TTY), a read-only root,
    ``env`` appended, and each of ``devices`` in ``linux.devices`` plus an
    ``{allow: true, type, major, minor, access: "rwm"}`` rule, and each ``(host, dest)`` of
    ``binds`` as a read-write bind mount (a control channel between test and container).
    """
    rootfs = bundles.make_busybox_rootfs(directory / "rootfs")

    config_path = directory / "config.json"
    config_path.unlink(missing_ok=True)
    subprocess.run([runc, "spec", "--bundle", str(directory)], check=True, capture_output=True)
    config = json.loads(config_path.read_text(encoding="utf-8"))
    process = config["process"]
    process["terminal"] = False
    process["args"] = list(args)
    process["env"] = [*process.get("env", []), *env]
    config["root"] = {"path": "rootfs", "readonly": True}
    for host, dest in binds:
        (rootfs / dest.lstrip("/")).mkdir(parents=True, exist_ok=True)
        config["mounts"].append(
            {"destination": dest, "type": "bind", "source": str(host), "options": ["rbind", "rw"]}
        )
    linux = config.setdefault("linux", {})
    linux["devices"] = [
        {
            "path": d.path,
            "type": d.type,
            "major": d.major,
            "minor": d.minor,
            "fileMode": d.file_mode,
            "uid": 0,
            "gid": 0,
        }
        for d in devices
    ]
    rules = linux.setdefault("resources", {}).setdefault("devices", [])
    rules.extend(
        {"allow": True, "type": d.type, "major": d.major, "minor": d.minor, "access": "rwm"}
        for d in devices
    )
    config_path.write_text(json.dumps(config, indent=2), encoding="utf-8")
    return directory


def delete_all(root: Path, *, runc: str = "runc") -> None:
    """Force-delete every container runc knows under ``root`` (fixture teardown)."""
    if not root.exists():
        return
    listed = subprocess.run(
        [runc, "--root", str(root), "list", "-q"], capture_output=True, text=True, check=False
    )
    for container_id in listed.stdout.split():
        subprocess.run(
            [runc, "--root", str(root), "delete", "--force", container_id],
            capture_output=True,
            check=False,
        )


def run_to_completion(runc: str, bundle: Path, state_root: Path) -> list[str]:
    """``runc run`` the bundle (its container force-deleted after); its stdout lines.

    The container must exit 0 (its stderr is the failure message otherwise)."""
    container_id = f"sgpu-test-{uuid.uuid4().hex[:12]}"
    try:
        result = subprocess.run(
            [runc, "--root", str(state_root), "run", "--bundle", str(bundle), container_id],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        subprocess.run(
            [runc, "--root", str(state_root), "delete", "--force", container_id],
            capture_output=True,
            check=False,
        )
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def lines_with(prefix: str, lines: Sequence[str]) -> list[str]:
    """The lines starting with ``prefix`` and a space, without them (a probe's report)."""
    return [line.removeprefix(prefix + " ") for line in lines if line.startswith(prefix + " ")]
