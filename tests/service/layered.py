"""Bundles as atelet at 533900d hands them over: an empty ``rootfs/`` and a
``rootfs-overlay.json`` naming cached image layers (``fs/`` + ``whiteouts.json``) that the
worker composes into the rootfs (substrate_gpu.rootfs.overlay)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from substrate_gpu.rootfs import overlay
from substrate_gpu.testing import bundles

#: What the app reports about the merged view, into ``/seen`` in its own rootfs.
OBSERVER_ARGS = [
    "sh",
    "-c",
    (
        "{ if [ -e /etc/gone ]; then echo present; else echo absent; fi; cat /etc/motd; "
        "ls /cache; } > /seen; exec sleep 100000"
    ),
]
SEEN = "absent\ntop\nnew\n"


def layered_actor_bundles(bundle_dir: Path, layers_dir: Path, apps: tuple[str, ...]) -> None:
    """Turn the plain bundles in ``bundle_dir`` (``_pause`` and ``apps``, made by
    :func:`substrate_gpu.testing.bundles.make_bundle`) into layered ones: a base layer (the
    busybox rootfs plus files the top layer deletes or hides) and a top layer (a whiteout, an
    opaque directory, a file), shared by every container, as the node's image cache shares
    them."""
    base = layers_dir / "sha256-base"
    top = layers_dir / "sha256-top"
    if not base.exists():
        (base / "fs").parent.mkdir(parents=True, exist_ok=True)
        bundles.make_busybox_rootfs(base / "fs")
        (base / "fs/etc").mkdir(exist_ok=True)
        (base / "fs/etc/gone").write_text("deleted by the top layer\n")
        (base / "fs/etc/motd").write_text("base\n")
        (base / "fs/cache").mkdir()
        (base / "fs/cache/old").write_text("hidden by the top layer\n")
        (top / "fs/etc").mkdir(parents=True)
        (top / "fs/etc/motd").write_text("top\n")
        (top / "fs/cache").mkdir()
        (top / "fs/cache/new").write_text("\n")
        record = {"version": 1, "whiteouts": ["etc/gone"], "opaques": ["cache"]}
        (top / "whiteouts.json").write_text(json.dumps(record))
    for name in ("_pause", *apps):
        container = bundle_dir / name
        shutil.rmtree(container / "rootfs")
        (container / "rootfs").mkdir()
        spec = {"version": 1, "layers": [str(base), str(top)], "extraDirs": ["/run/identity"]}
        (container / overlay.OVERLAY_SPEC).write_text(json.dumps(spec))
