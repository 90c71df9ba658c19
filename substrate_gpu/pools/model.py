"""The WorkerPool model: one frozen value, whichever YAML form the user wrote.

Two shapes of the same API are accepted (see ``docs/api-guide.md``, "GPU worker pools"):

============================  ============================================
user's flat form              upstream form
============================  ============================================
``spec.maxWorkers``           ``spec.replicas``
``spec.resourceRequests``     ``spec.template.resources.{requests,limits}``
``spec.nodeSelector``         ``spec.template.nodeSelector``
``spec.annotations``          ``spec.template.annotations``
(not in the flat form)        ``spec.template.{labels,tolerations,priorityClassName,
                              nodeAffinity,imagePullSecrets}``
``spec.runtimeClassName``     (upstream derives it; carried as given)
``spec.gpuSharing``           (not upstream; ours)
============================  ============================================

Decisions recorded here because they change what a pool means:

- ``resourceRequests`` holds *requests*. Kubernetes admits an extended resource
  (``nvidia.com/gpu``, ``example.com/foo``) only with an equal limit, so for those the
  flat form implies ``limits = requests``; native resources (``cpu``, ``memory``) stay
  requests only, which is what the word "requests" promises.
- A limit without a request is completed by Kubernetes (request = limit): the model keeps
  ``requests`` as written (so ``dataclasses.replace(pool, limits=…)`` never leaves a stale
  derived request behind) and :attr:`WorkerPool.effective_requests` shows the completed map.
- ``maxWorkers`` sizes the worker Deployment exactly like ``replicas``.
- Setting a flat field *and* its upstream counterpart is an error, not a merge.
- ``workerImage`` is the worker image; ``ateomImage`` (upstream's former name) means the
  same and is read when ``workerImage`` is absent.

From a document, the model is built only once it passed
:func:`~.validation.validate_document` (:func:`~.validation.load_pool` is the public way
in). Built in Python, a pool is checked the same way when it is sent:
:meth:`WorkerPool.to_document` is its upstream-form document, the one the validator and the
API server judge (``tests/pools`` hold ``pool_from_document(p.to_document()) == p``).
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
    "NodeAffinity",
    "NodeSelectorRequirement",
    "NodeSelectorTerm",
    "PreferredSchedulingTerm",
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


@dataclass(frozen=True)
class NodeSelectorRequirement:
    """One requirement on a node's labels or fields (core/v1 NodeSelectorRequirement)."""

    key: str
    """The label key (in ``match_fields``: the field, e.g. ``metadata.name``)."""
    operator: str
    """``In``, ``NotIn``, ``Exists``, ``DoesNotExist``, ``Gt`` or ``Lt``."""
    values: tuple[str, ...] = ()
    """One or more for In/NotIn, one integer for Gt/Lt, none for Exists/DoesNotExist."""

    def to_dict(self) -> bodies.NodeSelectorRequirementBody:
        """The Kubernetes JSON form."""
        raw: dict[str, object] = {"key": self.key, "operator": self.operator}
        if self.values:
            raw["values"] = list(self.values)
        return cast("bodies.NodeSelectorRequirementBody", raw)


@dataclass(frozen=True)
class NodeSelectorTerm:
    """Requirements that must all hold (core/v1 NodeSelectorTerm)."""

    match_expressions: tuple[NodeSelectorRequirement, ...] = ()
    """On node labels."""
    match_fields: tuple[NodeSelectorRequirement, ...] = ()
    """On node fields."""

    def to_dict(self) -> bodies.NodeSelectorTermBody:
        """The Kubernetes JSON form, without empty lists."""
        raw: dict[str, object] = {}
        if self.match_expressions:
            raw["matchExpressions"] = [r.to_dict() for r in self.match_expressions]
        if self.match_fields:
            raw["matchFields"] = [r.to_dict() for r in self.match_fields]
        return cast("bodies.NodeSelectorTermBody", raw)


@dataclass(frozen=True)
class PreferredSchedulingTerm:
    """A term the scheduler prefers, with its weight (core/v1 PreferredSchedulingTerm)."""

    weight: int
    """1..100."""
    preference: NodeSelectorTerm


@dataclass(frozen=True)
class NodeAffinity:
    """Where worker pods may (and prefer to) run (core/v1 NodeAffinity)."""

    required: tuple[NodeSelectorTerm, ...] | None = None
    """``requiredDuringSchedulingIgnoredDuringExecution``: a node must match one term;
    ``None`` for no requirement."""
    preferred: tuple[PreferredSchedulingTerm, ...] = ()
    """``preferredDuringSchedulingIgnoredDuringExecution``."""

    def to_dict(self) -> bodies.NodeAffinityBody:
        """The Kubernetes JSON form (``spec.affinity.nodeAffinity`` of a pod)."""
        raw: dict[str, object] = {}
        if self.required is not None:
            raw["requiredDuringSchedulingIgnoredDuringExecution"] = {
                "nodeSelectorTerms": [t.to_dict() for t in self.required]
            }
        if self.preferred:
            raw["preferredDuringSchedulingIgnoredDuringExecution"] = [
                {"weight": p.weight, "preference": p.preference.to_dict()} for p in self.preferred
            ]
        return cast("bodies.NodeAffinityBody", raw)


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
    worker_image: str | None = None
    """Worker runtime image (``spec.workerImage``); ``None`` means the controller's default."""
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
    node_affinity: NodeAffinity | None = None
    """Node affinity of the worker pods."""
    image_pull_secrets: tuple[str, ...] = ()
    """Names of Secrets in the pool's namespace to pull the worker image with."""
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

    def __post_init__(self) -> None:
        # Built in Python, a pool may be given plain dicts and lists: freeze them, so a
        # WorkerPool never changes after it is made, whichever way it was made.
        for name in ("node_selector", "labels", "annotations", "requests", "limits"):
            value = getattr(self, name)
            if not isinstance(value, MappingProxyType):
                object.__setattr__(self, name, MappingProxyType(dict(value)))

        for name in ("tolerations", "image_pull_secrets"):
            object.__setattr__(self, name, tuple(getattr(self, name)))

    @property
    def effective_requests(self) -> Mapping[str, str]:
        """The requests Kubernetes applies: those written, and each limit without one."""
        return MappingProxyType({**self.limits, **self.requests})

    @property
    def gpu_count(self) -> int:
        """NVIDIA GPUs per worker (0 for a CPU pool)."""
        return int(self.limits.get(GPU_RESOURCE, "0"))

    @property
    def is_gpu_pool(self) -> bool:
        """Whether workers get NVIDIA GPUs."""
        return self.gpu_count > 0

    def to_document(self) -> bodies.WorkerPoolBody:
        """The pool as a WorkerPool document, in the upstream form (every field expressible).

        What :func:`~.validation.validate_document` and the API server judge when a pool
        built in Python is sent; unset fields and defaults are left out.
        """
        template: dict[str, object] = {}
        if self.labels:
            template["labels"] = dict(self.labels)
        if self.annotations:
            template["annotations"] = dict(self.annotations)
        if self.node_selector:
            template["nodeSelector"] = dict(self.node_selector)
        if self.tolerations:
            template["tolerations"] = [t.to_dict() for t in self.tolerations]
        if self.priority_class_name is not None:
            template["priorityClassName"] = self.priority_class_name
        if self.node_affinity is not None:
            template["nodeAffinity"] = self.node_affinity.to_dict()
        resources = {
            kind: dict(values)
            for kind, values in (("requests", self.requests), ("limits", self.limits))
            if values
        }
        if resources:
            template["resources"] = resources
        if self.image_pull_secrets:
            template["imagePullSecrets"] = [{"name": n} for n in self.image_pull_secrets]
        spec: dict[str, object] = {"replicas": self.replicas, "sandboxClass": self.sandbox_class}
        if self.worker_image is not None:
            spec["workerImage"] = self.worker_image
        if self.runtime_class_name is not None:
            spec["runtimeClassName"] = self.runtime_class_name
        if self.sandbox_config_name is not None:
            spec["sandboxConfigName"] = self.sandbox_config_name
        if self.max_actors_per_worker != 1:
            spec["maxActorsPerWorker"] = self.max_actors_per_worker
        if self.gpu_sharing != GpuSharing():
            sharing: dict[str, object] = {"strategy": self.gpu_sharing.strategy}
            if self.gpu_sharing.clients_per_gpu is not None:
                sharing["clientsPerGpu"] = self.gpu_sharing.clients_per_gpu
            if self.gpu_sharing.gpu_capacity is not None:
                sharing["gpuCapacity"] = self.gpu_sharing.gpu_capacity
            spec["gpuSharing"] = sharing
        if template:
            spec["template"] = template
        return cast(
            "bodies.WorkerPoolBody",
            {
                "apiVersion": API_VERSION,
                "kind": KIND,
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": spec,
            },
        )


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
    affinity = _mapping(template.get("nodeAffinity"))
    node_affinity = (
        NodeAffinity(
            required=(
                tuple(
                    _term(t)
                    for t in _list(
                        _mapping(affinity["requiredDuringSchedulingIgnoredDuringExecution"]).get(
                            "nodeSelectorTerms"
                        )
                    )
                )
                if "requiredDuringSchedulingIgnoredDuringExecution" in affinity
                else None
            ),
            preferred=tuple(
                PreferredSchedulingTerm(
                    weight=_opt_int(_mapping(p).get("weight")) or 0,
                    preference=_term(_mapping(p).get("preference")),
                )
                for p in _list(affinity.get("preferredDuringSchedulingIgnoredDuringExecution"))
            ),
        )
        if "nodeAffinity" in template
        else None
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
        worker_image=_opt_str(spec.get("workerImage", spec.get("ateomImage"))),
        runtime_class_name=_opt_str(spec.get("runtimeClassName")),
        node_selector=_frozen(_strings(spec.get("nodeSelector", template.get("nodeSelector")))),
        tolerations=tolerations,
        labels=_frozen(_strings(template.get("labels"))),
        annotations=_frozen(_strings(spec.get("annotations", template.get("annotations")))),
        priority_class_name=_opt_str(template.get("priorityClassName")),
        node_affinity=node_affinity,
        image_pull_secrets=tuple(
            name
            for name in (
                _opt_str(_mapping(s).get("name")) for s in _list(template.get("imagePullSecrets"))
            )
            if name is not None
        ),
        requests=_frozen(requests),
        limits=_frozen(limits),
        gpu_sharing=sharing,
        sandbox_config_name=_opt_str(spec.get("sandboxConfigName")),
        max_actors_per_worker=_opt_int(spec.get("maxActorsPerWorker")) or 1,
    )


def _list(raw: object) -> list[object]:
    return list(raw) if isinstance(raw, list) else []


def _requirements(raw: object) -> tuple[NodeSelectorRequirement, ...]:
    return tuple(
        NodeSelectorRequirement(
            key=_opt_str(r.get("key")) or "",
            operator=_opt_str(r.get("operator")) or "",
            values=tuple(v for v in _list(r.get("values")) if isinstance(v, str)),
        )
        for r in (_mapping(item) for item in _list(raw))
    )


def _term(raw: object) -> NodeSelectorTerm:
    term = _mapping(raw)
    return NodeSelectorTerm(
        match_expressions=_requirements(term.get("matchExpressions")),
        match_fields=_requirements(term.get("matchFields")),
    )
