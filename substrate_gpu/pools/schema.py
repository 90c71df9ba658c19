"""The structural shape of a WorkerPool: one field tree, read by two consumers.

The Python validator walks this tree to report type errors and unknown fields, and
:mod:`substrate_gpu.pools.crd` turns the very same tree into the CRD's
``openAPIV3Schema``. Sharing the *structure* is safe: it is plain typing. The *semantic*
rules (GPU support per sandbox class, limits equal to requests, MPS consistency, …) are
deliberately written twice, once in Python (:mod:`.validation`) and once in CEL
(:mod:`.rules`), and a test proves the two agree on one table of cases.

Both shapes of the API live in one ``spec``: the user's documented flat form
(``nodeSelector``, ``resourceRequests``, ``maxWorkers``, ``runtimeClassName``,
``gpuSharing``, ``annotations``) and the upstream form (``replicas``, ``workerImage``,
``sandboxClass``, ``sandboxConfigName``, ``template.{labels,annotations,nodeSelector,
tolerations,priorityClassName,nodeAffinity,resources,imagePullSecrets}``). ``ateomImage``,
upstream's former name of ``workerImage``, is still accepted (deprecated, with a warning).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = [
    "INT32_MAX",
    "SPEC",
    "IntField",
    "IntOrStringField",
    "ListField",
    "MapField",
    "ObjectField",
    "SchemaField",
    "StringField",
]

INT32_MAX = 2**31 - 1
"""Integers are int32 in the Kubernetes API (replicas and friends)."""


@dataclass(frozen=True)
class StringField:
    """A string, optionally limited to an enum and a length."""

    description: str
    enum: tuple[str, ...] = ()
    """Allowed values; empty means any string."""
    min_length: int = 0
    max_length: int | None = None
    default: str | None = None
    """Applied by the API server; the validator reads an absent field the same way."""


@dataclass(frozen=True)
class IntField:
    """An integer (never a bool; YAML's ``true`` is not 1) within int32."""

    description: str


@dataclass(frozen=True)
class IntOrStringField:
    """Kubernetes' int-or-string: a resource quantity such as ``1``, ``"1"`` or ``"500m"``."""

    description: str
    max_length: int = 64
    """Bounds the string form, and with it the API server's cost estimate of the CEL rules
    that match patterns against it."""


@dataclass(frozen=True)
class MapField:
    """A string-keyed map; values share one schema."""

    description: str
    values: SchemaField
    max_properties: int
    """Bounded so the API server can bound the cost of CEL rules that iterate the map."""


@dataclass(frozen=True)
class ListField:
    """A list; items share one schema."""

    description: str
    items: SchemaField
    max_items: int
    min_items: int = 0


@dataclass(frozen=True)
class ObjectField:
    """An object with known properties; anything else is an unknown field."""

    description: str
    properties: Mapping[str, SchemaField] = field(default_factory=dict)
    required: tuple[str, ...] = ()


SchemaField = StringField | IntField | IntOrStringField | MapField | ListField | ObjectField

_LABEL_MAP = MapField(
    "Labels added to the worker pods.", StringField("Label value.", max_length=63), 64
)


def _resource_map(description: str) -> MapField:
    return MapField(description, IntOrStringField("A quantity; extended resources count."), 32)


_TOLERATION = ObjectField(
    "A toleration (core/v1 Toleration).",
    {
        "key": StringField("Taint key to tolerate; empty with operator Exists means all."),
        "operator": StringField("How key and value are compared.", enum=("Exists", "Equal")),
        "value": StringField("Taint value to match (operator Equal)."),
        "effect": StringField(
            "Taint effect to match; empty means all.",
            enum=("NoSchedule", "PreferNoSchedule", "NoExecute"),
        ),
        "tolerationSeconds": IntField("How long a NoExecute taint is tolerated."),
    },
)

_NODE_SELECTOR_REQUIREMENT = ObjectField(
    "A node selector requirement (core/v1 NodeSelectorRequirement).",
    {
        # Bounded (a qualified name; a label value or node name) so the API server can bound
        # the cost of the CEL rules that check them.
        "key": StringField(
            "The label key (or field, in matchFields) it applies to.",
            min_length=1,
            max_length=317,
        ),
        "operator": StringField(
            "How the key's value is compared with values.",
            enum=("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"),
        ),
        "values": ListField(
            "Values: one or more for In and NotIn, one integer for Gt and Lt, none for "
            "Exists and DoesNotExist.",
            StringField("A value.", max_length=253),
            64,
        ),
    },
    required=("key", "operator"),
)

_NODE_SELECTOR_TERM = ObjectField(
    "Requirements ANDed together (core/v1 NodeSelectorTerm).",
    {
        "matchExpressions": ListField(
            "Requirements on node labels.", _NODE_SELECTOR_REQUIREMENT, 16
        ),
        "matchFields": ListField("Requirements on node fields.", _NODE_SELECTOR_REQUIREMENT, 16),
    },
)

_NODE_AFFINITY = ObjectField(
    "Node affinity of the worker pods (core/v1 NodeAffinity); rendered as "
    "spec.affinity.nodeAffinity of the pod.",
    {
        "requiredDuringSchedulingIgnoredDuringExecution": ObjectField(
            "Terms ORed together: a node must match one of them.",
            {
                "nodeSelectorTerms": ListField(
                    "The terms (at least one).", _NODE_SELECTOR_TERM, 16, min_items=1
                )
            },
            required=("nodeSelectorTerms",),
        ),
        "preferredDuringSchedulingIgnoredDuringExecution": ListField(
            "Weighted terms the scheduler prefers.",
            ObjectField(
                "A weighted preference.",
                {
                    "weight": IntField("Weight of the preference (1..100)."),
                    "preference": _NODE_SELECTOR_TERM,
                },
                required=("weight", "preference"),
            ),
            16,
        ),
    },
)

_TEMPLATE = ObjectField(
    "Upstream form: metadata, scheduling and resources of the worker pods.",
    {
        "labels": _LABEL_MAP,
        "annotations": MapField(
            "Annotations added to the worker pods.", StringField("Annotation value."), 64
        ),
        "nodeSelector": MapField(
            "Node labels a worker's node must carry.", StringField("Label value."), 64
        ),
        "tolerations": ListField("Tolerations of the worker pods.", _TOLERATION, 16),
        "priorityClassName": StringField("PriorityClass of the worker pods.", min_length=1),
        "nodeAffinity": _NODE_AFFINITY,
        "resources": ObjectField(
            "Compute resources of the worker runtime container.",
            {
                "requests": _resource_map("Requested resources."),
                "limits": _resource_map("Resource limits."),
            },
        ),
        "imagePullSecrets": ListField(
            "Secrets of the pool's namespace to pull the worker image with.",
            ObjectField(
                "A Secret reference (core/v1 LocalObjectReference).",
                {"name": StringField("The Secret's name.", min_length=1)},
                required=("name",),
            ),
            16,
        ),
    },
)

_GPU_SHARING = ObjectField(
    "How workers share the GPUs of a node (default: exclusive, one worker per GPU).",
    {
        "strategy": StringField(
            "exclusive (default): every worker owns its GPUs; mps: NVIDIA MPS clients share one.",
        ),
        "clientsPerGpu": IntField("MPS only: workers sharing one GPU (2..48)."),
        "gpuCapacity": IntField(
            "Physical GPUs available to this pool in total; when set, the worker count is "
            "checked against it so the pool cannot oversubscribe them.",
        ),
    },
)

SPEC = ObjectField(
    "Desired state of a WorkerPool (the user's flat form and the upstream form).",
    {
        # The user's documented flat form.
        "nodeSelector": MapField(
            "Flat form of template.nodeSelector.", StringField("Label value."), 64
        ),
        "resourceRequests": _resource_map(
            "Flat form of template.resources: requests; extended resources (nvidia.com/gpu) "
            "get an equal limit implied."
        ),
        "maxWorkers": IntField("Flat form of replicas: the number of worker pods (1 or more)."),
        "runtimeClassName": StringField("RuntimeClass of the worker pods.", min_length=1),
        "gpuSharing": _GPU_SHARING,
        "annotations": MapField(
            "Flat form of template.annotations.", StringField("Annotation value."), 64
        ),
        # The upstream form.
        "replicas": IntField("The number of worker pods (0 or more)."),
        "workerImage": StringField(
            "The worker runtime image; optional: the controller's default applies without it.",
            min_length=1,
        ),
        "ateomImage": StringField(
            "Deprecated: upstream's former name of workerImage (accepted, with a warning).",
            min_length=1,
        ),
        "sandboxClass": StringField(
            "Sandbox runtime family: gvisor (default) or microvm.", default="gvisor"
        ),
        "sandboxConfigName": StringField("Cluster-scoped SandboxConfig to fetch binaries from."),
        "maxActorsPerWorker": IntField("Actors one worker pod may host at once (1..4094)."),
        "template": _TEMPLATE,
    },
)
"""The ``spec`` of a WorkerPool."""
