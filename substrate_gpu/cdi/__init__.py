"""CDI (Container Device Interface) specs: parse, validate, resolve device names to edits.

The public API, re-exported by name::

    from substrate_gpu import cdi

    spec = cdi.load_spec("/var/run/cdi/nvidia.json")   # or cdi.parse_spec(text)
    edits = cdi.edits_for_all(spec)                    # spec-level + device "all" only

    specs = cdi.load_spec_set(["/etc/cdi", "/var/run/cdi"])   # or cdi.SpecSet([spec, ...])
    edits = cdi.edits_for_devices(specs, ["nvidia.com/gpu=2"])  # spec-level + GPU 2 only
    gpus = cdi.list_gpus(specs)                        # name, index, UUID of each full GPU

Parsing is a pure function of the text (see :mod:`substrate_gpu.cdi.parse` for the design
decisions); the model (:mod:`substrate_gpu.cdi.model`) is frozen, so a parsed spec can be
cached per worker and shared between actors. Every problem is a
:class:`~substrate_gpu.exceptions.CdiSpecError`.
"""

from __future__ import annotations

from substrate_gpu.cdi.gpus import (
    DRA_CLAIM_KIND,
    NVIDIA_GPU_KIND,
    Gpu,
    list_gpus,
    mig_reason,
    refused_devices,
)
from substrate_gpu.cdi.model import (
    ALL_DEVICES,
    NO_PERMISSIONS,
    ContainerEdits,
    Device,
    DeviceNode,
    Hook,
    IntelRdt,
    Mount,
    NetDevice,
    Spec,
)
from substrate_gpu.cdi.names import QualifiedName, parse_qualified_name, qualified_name
from substrate_gpu.cdi.parse import MAX_SPEC_BYTES, load_spec, parse_spec
from substrate_gpu.cdi.specset import (
    SpecDirReader,
    SpecSet,
    edits_for_all,
    edits_for_devices,
    load_spec_set,
)
from substrate_gpu.cdi.versions import KNOWN_VERSIONS, minimum_required

__all__ = [
    "ALL_DEVICES",
    "DRA_CLAIM_KIND",
    "KNOWN_VERSIONS",
    "MAX_SPEC_BYTES",
    "NO_PERMISSIONS",
    "NVIDIA_GPU_KIND",
    "ContainerEdits",
    "Device",
    "DeviceNode",
    "Gpu",
    "Hook",
    "IntelRdt",
    "Mount",
    "NetDevice",
    "QualifiedName",
    "Spec",
    "SpecDirReader",
    "SpecSet",
    "edits_for_all",
    "edits_for_devices",
    "list_gpus",
    "load_spec",
    "load_spec_set",
    "mig_reason",
    "minimum_required",
    "parse_qualified_name",
    "parse_spec",
    "qualified_name",
    "refused_devices",
]
