"""Multi-GPU CDI specs derived from a real one-GPU spec (the T4 toolkit-1.20 spec).

A real spec holds, per GPU, devices ``<index>`` and ``GPU-<uuid>`` with the GPU's own nodes
(``/dev/nvidiaN``, its ``/dev/dri`` card and render node) and a ``create-symlinks`` hook for
the DRI by-path links, plus ``all``. :func:`with_gpus` repeats GPU 0's entries for N GPUs the
way nvidia-ctk would write them on an N-GPU node: minor numbers, DRI numbers, PCI bus ids and
UUIDs differ per GPU; spec-level edits are unchanged.
"""

from __future__ import annotations

import copy
import json
import uuid as uuid_
from pathlib import Path

import yaml

DATA = Path(__file__).resolve().parents[1] / "data" / "cdi"
T4_SPEC = DATA / "real-world/kwx4957-study__ctk-1.20.0__drv-615.71.09__rocky9-T4.yaml"


def load_raw(path: Path = T4_SPEC) -> dict:
    """A sample spec as a plain dict."""
    return yaml.safe_load(path.read_text())


def gpu_uuid(index: int) -> str:
    """A deterministic, well-formed GPU UUID for simulated GPU ``index``."""
    return f"GPU-{uuid_.uuid5(uuid_.NAMESPACE_OID, f'substrate-gpu-sim-{index}')}"


def _gpu_edits(template: dict, index: int) -> dict:
    text = json.dumps(template)
    text = (
        text.replace("/dev/nvidia0", f"/dev/nvidia{index}")
        .replace("renderD128", f"renderD{128 + index}")
        .replace("card0", f"card{index}")
        .replace("0000:00:04.0", f"0000:00:{4 + index:02x}.0")
    )
    edits = json.loads(text)
    for node in edits.get("deviceNodes", []):
        if node["path"] in (f"/dev/nvidia{index}", f"/dev/dri/card{index}"):
            node["minor"] = index
        elif node["path"] == f"/dev/dri/renderD{128 + index}":
            node["minor"] = 128 + index
        if node.get("minor") == 0:
            del node["minor"]  # Go's omitempty, as nvidia-ctk writes it
    return edits


def with_gpus(raw: dict, count: int) -> dict:
    """``raw`` (a one-GPU nvidia-ctk spec) rewritten for ``count`` GPUs."""
    spec = copy.deepcopy(raw)
    template = next(d for d in spec["devices"] if d["name"] == "0")["containerEdits"]
    devices: list[dict] = []
    all_nodes: list[dict] = []
    all_hooks: list[dict] = []
    gids: list[int] = []
    for index in range(count):
        edits = _gpu_edits(template, index)
        devices.append({"name": str(index), "containerEdits": edits})
        devices.append({"name": gpu_uuid(index), "containerEdits": copy.deepcopy(edits)})
        all_nodes.extend(edits.get("deviceNodes", []))
        all_hooks.extend(edits.get("hooks", []))
        gids.extend(g for g in edits.get("additionalGids", []) if g not in gids)
    all_edits: dict = {"deviceNodes": all_nodes}
    if all_hooks:
        all_edits["hooks"] = all_hooks
    if gids:
        all_edits["additionalGids"] = gids
    devices.append({"name": "all", "containerEdits": all_edits})
    spec["devices"] = devices
    return spec
