"""A spec's GPUs, for handing them out one by one; and recognising MIG devices.

Pure functions on parsed specs. nvidia-ctk writes, per full GPU, one device per naming
strategy that repeat the same edits: ``<index>`` (``0``), ``GPU-<uuid>``, and with the
legacy ``type-index`` strategy ``gpu<index>``; plus ``all``. A GPU is identified by its
``/dev/nvidiaN`` node: devices whose edits hold exactly that one GPU node are names of the
same GPU. ``all`` (and any device holding several GPU nodes) is not a GPU.

**DRA claims.** NVIDIA's DRA driver writes one transient spec per ResourceClaim, kind
``k8s.gpu.nvidia.com/claim``, whose devices are named ``<claim-uid>-gpu-<minor>`` (a MIG
instance: ``<claim-uid>-gpu-<minor>-mig-<profile>-<start>-<size>``) and carry the same
per-GPU edits as the toolkit's. A claim device is one more name of the GPU whose
``/dev/nvidiaN`` node it holds, so the allocator hands it out like an index or UUID name
and never gives the same GPU twice under two names. On a fresh node the driver has written
claim devices without any ``/dev/nvidia*`` node (the device files did not exist yet;
dra-driver-nvidia-gpu #1380): such a device is refused by name (:func:`not_a_gpu_reason`),
since the container would start with no GPU while looking fine.

**MIG.** nvproxy, gVisor's GPU proxy, does not support MIG (brief §10): a MIG instance's
CUDA clients need the ``/dev/nvidia-caps/nvidia-cap<N>`` capability nodes and the MIG
ioctls behind them. A device is a MIG device when

* its name is one nvidia-ctk gives MIG devices: ``<gpu>:<mig>`` (index strategy, e.g.
  ``0:1``), ``mig<gpu>:<mig>`` (type-index), ``MIG-<uuid>`` (uuid strategy), or the DRA
  driver's ``…-gpu-<minor>-mig-…``; or
* its edits hold a node under ``/dev/nvidia-caps/`` (the GPU-instance and compute-instance
  access capabilities; also the MIG config/monitor capabilities of a management spec).

The second rule catches what a name cannot: a DRA claim's device carrying a MIG instance
under a claim-specific name, and ``all`` on a node where MIG is enabled. The IMEX channel
nodes (``/dev/nvidia-caps-imex-channels/``) are a different directory and are not MIG.
A GPU in MIG mode (a MIG device shares its ``/dev/nvidiaN`` node) is not listed as
allocatable: CUDA cannot use a MIG-enabled GPU as a whole.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Protocol

from substrate_gpu.cdi import model, names

if TYPE_CHECKING:
    from collections.abc import Iterator


class Devices(Protocol):
    """Where :func:`list_gpus` finds devices (:class:`~substrate_gpu.cdi.specset.SpecSet` is
    one): a Protocol, so this module does not import the spec set, which imports it."""

    def devices(
        self, *, kind: str | None = None
    ) -> Iterator[tuple[names.QualifiedName, model.Device]]:
        """Every resolvable device (of ``kind``, when given)."""
        ...


#: The kind nvidia-ctk writes for GPUs.
NVIDIA_GPU_KIND: Final = "nvidia.com/gpu"
#: The kind of NVIDIA's DRA driver's per-claim specs (vendor ``k8s.gpu.nvidia.com``, class
#: ``claim``); their GPUs are named ``<claim-uid>-gpu-<minor>``.
DRA_CLAIM_KIND: Final = "k8s.gpu.nvidia.com/claim"

_GPU_NODE: Final = re.compile(r"/dev/nvidia([0-9]+)")
_MIG_NAME: Final = re.compile(r"(?:mig)?[0-9]+:[0-9]+|MIG-.+|.*-gpu-[0-9]+-mig-.*")
_NVIDIA_NODE_PREFIX: Final = "/dev/nvidia"
_INDEX_NAME: Final = re.compile(r"(?:gpu)?([0-9]+)")
_MIG_CAPS_DIR: Final = "/dev/nvidia-caps/"


def mig_reason(device: model.Device) -> str | None:
    """Why ``device`` is a MIG device (see the module docstring), or ``None`` if it is not."""
    if _MIG_NAME.fullmatch(device.name):
        return f"its name {device.name!r} is a MIG device name"
    for node in device.container_edits.device_nodes:
        if node.path.startswith(_MIG_CAPS_DIR):
            return f"it holds the MIG capability node {node.path}"
    return None


def edits_mig_reason(edits: model.ContainerEdits) -> str | None:
    """Why merged ``edits`` would give a container MIG access, or ``None``."""
    for node in edits.device_nodes:
        if node.path.startswith(_MIG_CAPS_DIR):
            return f"the edits hold the MIG capability node {node.path}"
    return None


def gpu_nodes(edits: model.ContainerEdits) -> tuple[str, ...]:
    """The ``/dev/nvidiaN`` container paths among ``edits``' device nodes, in order."""
    return tuple(n.path for n in edits.device_nodes if _GPU_NODE.fullmatch(n.path))


def is_nvidia_kind(kind: str) -> bool:
    """Whether ``kind``'s vendor is NVIDIA's (``nvidia.com`` or a subdomain of it, as the DRA
    driver's ``k8s.gpu.nvidia.com``)."""
    vendor = kind.partition("/")[0]
    return vendor == "nvidia.com" or vendor.endswith(".nvidia.com")


def no_nvidia_node_reason(device: model.Device) -> str | None:
    """Why ``device`` would give a container no NVIDIA device at all, or ``None``.

    Its own edits must hold a ``/dev/nvidia*`` node: a device with only ``/dev/dri`` nodes,
    hooks or env (a DRA claim spec written before the node's device files existed) starts
    a container that looks fine and has no GPU.
    """
    if any(n.path.startswith(_NVIDIA_NODE_PREFIX) for n in device.container_edits.device_nodes):
        return None
    return (
        f"its edits carry no {_NVIDIA_NODE_PREFIX}* device node (a DRA driver writes such"
        " specs when the node's /dev/nvidia* files did not exist yet: create them, e.g. with"
        " nvidia-smi or nvidia-modprobe, then re-create the claim)"
    )


def not_a_gpu_reason(device: model.Device) -> str | None:
    """Why the allocator cannot hand ``device`` out as one full GPU, or ``None`` if it can."""
    reason = mig_reason(device) or no_nvidia_node_reason(device)
    if reason is not None:
        return reason
    nodes = gpu_nodes(device.container_edits)
    if len(nodes) != 1:
        return f"it holds {len(nodes)} /dev/nvidiaN GPU nodes, not one"
    return None


@dataclass(frozen=True)
class Gpu:
    """One full GPU of a spec set, with every name that requests it."""

    name: str
    """The qualified name to request it by: the index name when there is one
    (``nvidia.com/gpu=0``), else the UUID name, else the first name in sort order."""
    index: int | None
    """The toolkit's index (from the ``<index>`` or ``gpu<index>`` device), if named so."""
    uuid: str | None
    """``GPU-…``, if the spec names the GPU by UUID."""
    node: str
    """Its ``/dev/nvidiaN`` node (container path)."""
    names: tuple[str, ...]
    """Every qualified name of this GPU, sorted."""


def _node_number(node: str) -> int:
    match = _GPU_NODE.fullmatch(node)
    return int(match.group(1)) if match else -1


def _gpu_kind_devices(
    spec_set: Devices, kind: str
) -> Iterator[tuple[names.QualifiedName, model.Device]]:
    yield from spec_set.devices(kind=kind)
    if kind == NVIDIA_GPU_KIND:
        yield from spec_set.devices(kind=DRA_CLAIM_KIND)


def list_gpus(spec_set: Devices, *, kind: str = NVIDIA_GPU_KIND) -> tuple[Gpu, ...]:
    """The full GPUs that specs of ``kind`` define, in a deterministic order.

    Ordered by index, then by node number (GPUs without an index name last). GPUs in MIG
    mode are left out (see the module docstring). Devices whose name is defined in more
    than one spec of the same priority are left out too (requesting them is an error).
    With the default ``kind``, DRA claim devices (:data:`DRA_CLAIM_KIND`) are further names
    of the GPU whose node they hold.
    """
    by_node: dict[str, list[tuple[names.QualifiedName, model.Device]]] = {}
    mig_nodes: set[str] = set()
    for qualified, device in _gpu_kind_devices(spec_set, kind):
        nodes = gpu_nodes(device.container_edits)
        if device.name == model.ALL_DEVICES or len(nodes) != 1:
            continue  # not one GPU: `all`, or a group of GPUs
        if mig_reason(device) is not None:
            mig_nodes.add(nodes[0])
            continue
        by_node.setdefault(nodes[0], []).append((qualified, device))
    gpus: list[Gpu] = []
    for node, entries in by_node.items():
        if node in mig_nodes:
            continue
        index: int | None = None
        uuid: str | None = None
        for _, device in entries:
            match = _INDEX_NAME.fullmatch(device.name)
            if match and (index is None or device.name.isdigit()):
                index = int(match.group(1))
            if device.name.startswith("GPU-"):
                uuid = device.name
        all_names = sorted(str(q) for q, _ in entries)
        preferred = next(
            (str(q) for q, d in entries if d.name.isdigit()),
            next((str(q) for q, d in entries if d.name == uuid), all_names[0]),
        )
        gpus.append(Gpu(preferred, index, uuid, node, tuple(all_names)))
    gpus.sort(
        key=lambda g: (g.index is None, g.index if g.index is not None else 0, _node_number(g.node))
    )
    return tuple(gpus)


def refused_devices(spec_set: Devices, *, kind: str = NVIDIA_GPU_KIND) -> dict[str, str]:
    """Qualified name -> why it is not an allocatable GPU, for the devices of ``kind`` (and
    of DRA claims) that :func:`list_gpus` leaves out, ``all`` excepted (it names every GPU)."""
    listed = {name for gpu in list_gpus(spec_set, kind=kind) for name in gpu.names}
    refused: dict[str, str] = {}
    for qualified, device in _gpu_kind_devices(spec_set, kind):
        name = str(qualified)
        if device.name == model.ALL_DEVICES or name in listed:
            continue
        refused[name] = not_a_gpu_reason(device) or "its GPU is in MIG mode"
    return refused
