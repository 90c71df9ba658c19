"""podman's embedded CDI library as an oracle: the OCI config the reference produces.

``podman create --device <qualified name>…`` followed by ``podman init`` writes, under its
storage's ``userdata/config.json``, the OCI config the CDI reference library produced for a
spec in ``/etc/cdi``. podman 4.3's library accepts cdiVersion ≤ 0.6.0. Every spec written
here gets a unique file name (parallel runs share /etc/cdi), and callers give it a unique
kind (:func:`unique_kind`) so two runs never define the same device.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path

CDI_DIR = Path("/etc/cdi")
IMAGE = "localhost/substrate-oracle:latest"


def unique_kind(label: str = "gpu") -> str:
    """A CDI kind no other test run uses (``substrate-oracle-<hex>.example/<label>``)."""
    return f"substrate-oracle-{uuid.uuid4().hex[:10]}.example/{label}"


class OracleRefused(Exception):
    """podman (the reference library) refused the spec or the request; ``stderr`` says why."""

    def __init__(self, stderr: str) -> None:
        self.stderr = stderr
        super().__init__(stderr)


@dataclass(frozen=True)
class Podman:
    """podman with private, throw-away storage and a busybox image imported into it."""

    argv: tuple[str, ...]
    storage: Path

    @classmethod
    def create(cls, binary: str, state: Path, busybox: Path, *, run: Path | None = None) -> Podman:
        """``run``: the run root (default ``state/run``; podman refuses more than 50
        characters)."""
        argv = (
            binary,
            "--root",
            str(state / "root"),
            "--runroot",
            str(run or state / "run"),
            "--storage-driver",
            "vfs",
            "--cgroup-manager",
            "cgroupfs",
            "--events-backend",
            "none",
        )
        rootfs = state / "image"
        (rootfs / "bin").mkdir(parents=True)
        shutil.copy2(busybox, rootfs / "bin" / "busybox")
        tar = subprocess.run(
            ["tar", "-C", str(rootfs), "-c", "."], capture_output=True, check=True
        ).stdout
        subprocess.run(
            [*argv, "import", "-", IMAGE], input=tar, capture_output=True, check=True, timeout=120
        )
        return cls(argv=argv, storage=state / "root")

    def reference_config(
        self,
        specs: dict[str, dict[str, object]],
        devices: list[str],
        *,
        create_args: tuple[str, ...] = (),
    ) -> dict:
        """The OCI config podman's CDI library writes when ``devices`` are requested.

        ``specs`` maps a file stem to a spec, all written to /etc/cdi for this call only.
        Raises :class:`OracleRefused` when podman refuses (bad spec, unknown device).
        """
        name = f"substrate-oracle-{uuid.uuid4().hex[:10]}"
        CDI_DIR.mkdir(parents=True, exist_ok=True)
        files = [CDI_DIR / f"{name}-{stem}.json" for stem in specs]
        for path, spec in zip(files, specs.values(), strict=True):
            path.write_text(json.dumps(spec))
        try:
            device_args = [arg for d in devices for arg in ("--device", d)]
            created = subprocess.run(
                [*self.argv, "create", *device_args, *create_args, "--name", name, IMAGE, "sh"],
                capture_output=True,
                text=True,
                check=False,
                timeout=120,
            )
            if created.returncode != 0:
                raise OracleRefused(created.stderr)
            # init writes config.json, then may fail running the toolkit's hooks: fine.
            init = subprocess.run(
                [*self.argv, "init", name], capture_output=True, text=True, check=False, timeout=120
            )
            container_id = subprocess.run(
                [*self.argv, "inspect", "-f", "{{.Id}}", name],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.strip()
            config = self.storage / "vfs-containers" / container_id / "userdata" / "config.json"
            if not config.exists():
                raise OracleRefused(init.stderr)
            return json.loads(config.read_text())
        finally:
            subprocess.run([*self.argv, "rm", "-f", name], capture_output=True, check=False)
            for path in files:
                path.unlink(missing_ok=True)


def find_podman() -> str | None:
    """The podman binary, if installed."""
    return shutil.which("podman")
