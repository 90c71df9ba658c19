"""CDI (Container Device Interface) specs: parse, validate, and pick the edits for all GPUs.

The public API, re-exported by name::

    from substrate_gpu import cdi

    spec = cdi.load_spec("/var/run/cdi/nvidia.json")   # or cdi.parse_spec(text)
    edits = cdi.edits_for_all(spec)                    # spec-level + device "all" only

Parsing is a pure function of the text (see :mod:`substrate_gpu.cdi.parse` for the design
decisions); the model (:mod:`substrate_gpu.cdi.model`) is frozen, so a parsed spec can be
cached per worker and shared between actors. Every problem is a
:class:`~substrate_gpu.exceptions.CdiSpecError`.
"""

from __future__ import annotations

from substrate_gpu.cdi.model import (
    ALL_DEVICES,
    ContainerEdits,
    Device,
    DeviceNode,
    Hook,
    IntelRdt,
    Mount,
    NetDevice,
    Spec,
)
from substrate_gpu.cdi.parse import edits_for_all, load_spec, parse_spec
from substrate_gpu.cdi.versions import KNOWN_VERSIONS, minimum_required

__all__ = [
    "ALL_DEVICES",
    "KNOWN_VERSIONS",
    "ContainerEdits",
    "Device",
    "DeviceNode",
    "Hook",
    "IntelRdt",
    "Mount",
    "NetDevice",
    "Spec",
    "edits_for_all",
    "load_spec",
    "minimum_required",
    "parse_spec",
]
