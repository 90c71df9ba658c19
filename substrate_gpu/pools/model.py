"""The WorkerPool model: one frozen value, whichever YAML form the user wrote.

Two shapes of the same API are accepted (see ``docs/api-guide.md``, "GPU worker pools"):

============================  ============================================
user's flat form              upstream form
============================  ============================================
``spec.maxWorkers``           ``spec.replicas``
``spec.resourceRequests``     ``spec.template.resources.{requests,limits}``
``spec.nodeSelector``         ``spec.template.nodeSelector``
``spec.annotations``          ``spec.template.annotations``
(not in the flat form)        ``spec.template.{labels,tolerations,priorityClassName}``
``spec.runtimeClassName``     (upstream derives it; carried as given)
``spec.gpuSharing``           (not upstream; ours)
============================  ============================================

Decisions recorded here because they change what a pool means:

- ``resourceRequests`` holds *requests*. Kubernetes admits an extended resource
  (``nvidia.com/gpu``, ``example.com/foo``) only with an equal limit, so for those the
  flat form implies ``limits = requests``; native resources (``cpu``, ``memory``) stay
  requests only, which is what the word "requests" promises.
- A limit without a request is completed by Kubernetes (request = limit); we do the same
  so the model always shows both.
- ``maxWorkers`` sizes the worker Deployment exactly like ``replicas``.
- Setting a flat field *and* its upstream counterpart is an error, not a merge.

The model is built only from a document that passed :func:`~.validation.validate_document`;
:func:`~.validation.load_pool` is the public way in.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Literal, cast

if TYPE_CHECKING:
    from substrate_gpu.pools import bodies

__all__ = [
    "API_GROUP",
    "API_VERSION",
    "DEFAULT_SANDBOX_CLASS",
    "GPU_RESOURCE",
    "GPU_RESOURCES",
    "KIND",
    "POOL_LABEL",
    "UPSTREAM_POOL_LABEL",
    "GpuResourceSupport",
    "GpuSharing",
    "SandboxClass",
    "SharingStrategy",
    "Toleration",
    "WorkerPool",
    "gpu_support_message",
    "is_extended_resource",
    "pool_from_document",
]

API_GROUP = "substrate.agent-substrate.github.com"
API_VERSION = f"{API_GROUP}/v1alpha1"
KIND = "WorkerPool"

GPU_RESOURCE = "nvidia.com/gpu"
"""The one GPU resource substrate-gpu passes into sandboxes (through gVisor's nvproxy)."""

POOL_LABEL = "substrate.io/worker-pool"
"""Label on every worker of a pool (the user's documentation selects on it)."""
UPSTREAM_POOL_LABEL = "ate.dev/worker-pool"
"""The upstream project's label for the same thing; workers carry both."""

SandboxClass = Literal["gvisor", "microvm"]
SharingStrategy = Literal["exclusive", "mps"]
DEFAULT_SANDBOX_CLASS: SandboxClass = "gvisor"


@dataclass(frozen=True)
class GpuResourceSupport:
    """Which sandbox classes can pass one vendor's GPU resource into actors, and why."""

    sandbox_classes: frozenset[str]
    """Classes that support it. Positive on purpose: a new class must opt in here."""
    reason: str
    """Why the other classes cannot (shown in the error)."""


GPU_RESOURCES: Mapping[str, GpuResourceSupport] = MappingProxyType(
    {
        GPU_RESOURCE: GpuResourceSupport(
            frozenset({"gvisor"}),
            "only gVisor's nvproxy passes NVIDIA GPUs into sandboxes; micro-VM pools have none",
        ),
        "amd.com/gpu": GpuResourceSupport(
            frozenset(),
            "gVisor has no proxy driver for AMD GPUs (nvproxy is NVIDIA-only) and micro-VM "
            "pools have no GPU passthrough",
        ),
        "gpu.intel.com/i915": GpuResourceSupport(
            frozenset(),
            "gVisor has no proxy driver for Intel GPUs (nvproxy is NVIDIA-only) and micro-VM "
            "pools have no GPU passthrough",
        ),
        "gpu.intel.com/xe": GpuResourceSupport(
            frozenset(),
            "gVisor has no proxy driver for Intel GPUs (nvproxy is NVIDIA-only) and micro-VM "
            "pools have no GPU passthrough",
        ),
    }
)
"""Every GPU resource name we recognise. An unknown vendor's name is just an extended
resource; a recognised one is never silently accepted where it cannot work."""


def gpu_support_message(resource: str) -> str:
    """The error for ``resource`` on a sandbox class that does not support it."""
    support = GPU_RESOURCES[resource]
    if support.sandbox_classes:
        classes = " or ".join(f"'{c}'" for c in sorted(support.sandbox_classes))
        return f"{resource} is only supported when sandboxClass is {classes}"
    return f"{resource} is not supported: {support.reason}"


def is_extended_resource(name: str) -> bool:
    """Whether Kubernetes treats ``name`` as an extended resource (integer, limit = request).

    Mirrors ``IsExtendedResourceName``: a domain-prefixed name outside ``kubernetes.io``
    that is not a quota name (``requests.…``).
    """
    return "/" in name and "kubernetes.io/" not in name and not name.startswith("requests.")


@dataclass(frozen=True)
class Toleration:
    """A worker pod toleration (core/v1 Toleration)."""

    key: str | None = None
    """Taint key; ``None`` with operator Exists tolerates every taint."""
    operator: str | None = None
    """``Exists`` or ``Equal`` (Kubernetes' default)."""
    value: str | None = None
    """Taint value compared with operator Equal."""
    effect: str | None = None
    """``NoSchedule``, ``PreferNoSchedule``, ``NoExecute``; ``None`` matches all."""
    toleration_seconds: int | None = None
    """How long a NoExecute taint is tolerated."""

    def to_dict(self) -> bodies.TolerationBody:
        """The Kubernetes JSON form, without unset fields."""
        raw: dict[str, object] = {
            "key": self.key,
            "operator": self.operator,
            "value": self.value,
            "effect": self.effect,
            "tolerationSeconds": self.toleration_seconds,
        }
        return cast("bodies.TolerationBody", {k: v for k, v in raw.items() if v is not None})


@dataclass(frozen=True)
class GpuSharing:
    """How the pool's workers share GPUs."""

    strategy: SharingStrategy = "exclusive"
    """``exclusive``: each worker owns its GPUs; ``mps``: NVIDIA MPS clients share one GPU."""
    clients_per_gpu: int | None = None
    """MPS only: how many workers share one GPU (the device plugin's MPS replicas)."""
    gpu_capacity: int | None = None
    """Physical GPUs available to the pool, when the user told us (oversubscription check)."""


def _frozen(mapping: Mapping[str, str]) -> Mapping[str, str]:
    return MappingProxyType(dict(mapping))


@dataclass(frozen=True)
class WorkerPool:
    """A validated WorkerPool, normalised from either YAML form."""

    name: str
    """``metadata.name``; also the value of the pool labels on its workers."""
    namespace: str
    """``metadata.namespace`` (``default`` when omitted, like kubectl)."""
    replicas: int
    """Worker pods to run (``spec.replicas`` or ``spec.maxWorkers``)."""
    sandbox_class: SandboxClass = DEFAULT_SANDBOX_CLASS
    """Sandbox runtime family; only ``gvisor`` supports GPUs (nvproxy)."""
    ateom_image: str | None = None
    """Worker runtime image; ``None`` means the controller's default."""
    runtime_class_name: str | None = None
    """RuntimeClass of the worker pods (e.g. ``nvidia``)."""
    node_selector: Mapping[str, str] = field(default_factory=lambda: _frozen({}))
    """Node labels a worker's node must carry."""
    tolerations: tuple[Toleration, ...] = ()
    """Tolerations of the worker pods."""
    labels: Mapping[str, str] = field(default_factory=lambda: _frozen({}))
    """Extra labels of the worker pods (the pool labels are added on top)."""
    annotations: Mapping[str, str] = field(default_factory=lambda: _frozen({}))
    """Annotations of the worker pods (e.g. ``k8s.v1.cni.cncf.io/networks: gpu-net``)."""
    priority_class_name: str | None = None
    """PriorityClass of the worker pods."""
    requests: Mapping[str, str] = field(default_factory=lambda: _frozen({}))
    """Resource requests of the worker runtime container, as Kubernetes quantity strings."""
    limits: Mapping[str, str] = field(default_factory=lambda: _frozen({}))
    """Resource limits of the worker runtime container (extended resources equal requests)."""
    gpu_sharing: GpuSharing = field(default_factory=GpuSharing)
    """GPU sharing between workers."""
    sandbox_config_name: str | None = None
    """Upstream: the SandboxConfig to fetch sandbox binaries from (carried, not rendered)."""
    max_actors_per_worker: int = 1
    """Upstream: actors one worker may host at once (carried, not rendered)."""

    @property
    def gpu_count(self) -> int:
        """NVIDIA GPUs per worker (0 for a CPU pool)."""
        return int(self.limits.get(GPU_RESOURCE, "0"))

    @property
    def is_gpu_pool(self) -> bool:
        """Whether workers get NVIDIA GPUs."""
        return self.gpu_count > 0


def _quantities(raw: object) -> dict[str, str]:
    if not isinstance(raw, Mapping):
        return {}
    return {str(k): str(v) for k, v in raw.items()}


def _strings(raw: object) -> dict[str, str]:
    if not isinstance(raw, Mapping):
        return {}
    return {str(k): str(v) for k, v in raw.items()}


def _mapping(raw: object) -> Mapping[str, object]:
    return cast("Mapping[str, object]", raw) if isinstance(raw, Mapping) else {}


def _opt_str(raw: object) -> str | None:
    return raw if isinstance(raw, str) else None


def _opt_int(raw: object) -> int | None:
    return raw if isinstance(raw, int) and not isinstance(raw, bool) else None


def pool_from_document(doc: Mapping[str, object]) -> WorkerPool:
    """Normalise a *validated* WorkerPool document into the model (see the module docstring)."""
    metadata = _mapping(doc.get("metadata"))
    spec = _mapping(doc.get("spec"))
    template = _mapping(spec.get("template"))
    resources = _mapping(template.get("resources"))

    if "resourceRequests" in spec:
        requests = _quantities(spec["resourceRequests"])
        limits = {k: v for k, v in requests.items() if is_extended_resource(k)}
    else:
        requests = _quantities(resources.get("requests"))
        limits = _quantities(resources.get("limits"))
        # Kubernetes defaults a missing request to the limit; show it explicitly.
        requests |= {k: v for k, v in limits.items() if k not in requests}

    sharing_raw = _mapping(spec.get("gpuSharing"))
    strategy = sharing_raw.get("strategy", "exclusive")
    sharing = GpuSharing(
        strategy="mps" if strategy == "mps" else "exclusive",
        clients_per_gpu=_opt_int(sharing_raw.get("clientsPerGpu")),
        gpu_capacity=_opt_int(sharing_raw.get("gpuCapacity")),
    )
    tolerations = tuple(
        Toleration(
            key=_opt_str(t.get("key")),
            operator=_opt_str(t.get("operator")),
            value=_opt_str(t.get("value")),
            effect=_opt_str(t.get("effect")),
            toleration_seconds=_opt_int(t.get("tolerationSeconds")),
        )
        for t in (_mapping(item) for item in _list(template.get("tolerations")))
    )
    replicas = _opt_int(spec.get("maxWorkers"))
    if replicas is None:
        replicas = _opt_int(spec.get("replicas")) or 0
    sandbox_class: SandboxClass = "microvm" if spec.get("sandboxClass") == "microvm" else "gvisor"
    return WorkerPool(
        name=str(metadata.get("name", "")),
        namespace=_opt_str(metadata.get("namespace")) or "default",
        replicas=replicas,
        sandbox_class=sandbox_class,
        ateom_image=_opt_str(spec.get("ateomImage")),
        runtime_class_name=_opt_str(spec.get("runtimeClassName")),
        node_selector=_frozen(_strings(spec.get("nodeSelector", template.get("nodeSelector")))),
        tolerations=tolerations,
        labels=_frozen(_strings(template.get("labels"))),
        annotations=_frozen(_strings(spec.get("annotations", template.get("annotations")))),
        priority_class_name=_opt_str(template.get("priorityClassName")),
        requests=_frozen(requests),
        limits=_frozen(limits),
        gpu_sharing=sharing,
        sandbox_config_name=_opt_str(spec.get("sandboxConfigName")),
        max_actors_per_worker=_opt_int(spec.get("maxActorsPerWorker")) or 1,
    )


def _list(raw: object) -> list[object]:
    return list(raw) if isinstance(raw, list) else []
