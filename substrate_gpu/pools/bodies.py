"""The WorkerPool resource as typed dicts, field by field (its YAML/JSON form).

Both shapes the API accepts (the user's flat form and the upstream ``template`` form, see
:mod:`substrate_gpu.pools.model`) in one definition, in the API's spelling; every field is
optional at this level (``validate_document`` decides what a pool must have). These describe
a document that passed validation; a document read from a file is untrusted until then. The
tests check these against the CRD's OpenAPI schema (:func:`~substrate_gpu.pools.render_crd`)
and the example pools in the test data.
"""

# No `from __future__ import annotations` here: Python 3.11's TypedDict reads Required[...]
# only from evaluated annotations (with strings, __required_keys__ comes out empty).

from typing import TypedDict

#: A Kubernetes quantity as YAML gives it: ``"1"``, ``1``, ``"500m"``, ``"16Gi"``.
Quantity = str | int


class ObjectMetaBody(TypedDict, total=False):
    """``metadata`` (the fields a pool uses)."""

    name: str
    namespace: str
    labels: dict[str, str]
    annotations: dict[str, str]


class TolerationBody(TypedDict, total=False):
    """``spec.template.tolerations[]``: a Kubernetes Toleration."""

    key: str
    operator: str
    """``Exists`` or ``Equal``."""
    value: str
    effect: str
    tolerationSeconds: int


class ResourcesBody(TypedDict, total=False):
    """``spec.template.resources``: the worker runtime container's requests and limits."""

    requests: dict[str, Quantity]
    limits: dict[str, Quantity]


class NodeSelectorRequirementBody(TypedDict, total=False):
    """A core/v1 NodeSelectorRequirement."""

    key: str
    operator: str
    """``In``, ``NotIn``, ``Exists``, ``DoesNotExist``, ``Gt``, ``Lt``."""
    values: list[str]


class NodeSelectorTermBody(TypedDict, total=False):
    """A core/v1 NodeSelectorTerm."""

    matchExpressions: list[NodeSelectorRequirementBody]
    matchFields: list[NodeSelectorRequirementBody]


class NodeSelectorBody(TypedDict, total=False):
    """A core/v1 NodeSelector (the required part of a node affinity)."""

    nodeSelectorTerms: list[NodeSelectorTermBody]


class PreferredSchedulingTermBody(TypedDict, total=False):
    """A core/v1 PreferredSchedulingTerm."""

    weight: int
    preference: NodeSelectorTermBody


class NodeAffinityBody(TypedDict, total=False):
    """``spec.template.nodeAffinity``: a core/v1 NodeAffinity."""

    requiredDuringSchedulingIgnoredDuringExecution: NodeSelectorBody
    preferredDuringSchedulingIgnoredDuringExecution: list[PreferredSchedulingTermBody]


class LocalObjectReferenceBody(TypedDict, total=False):
    """``spec.template.imagePullSecrets[]``: a Secret in the pool's namespace."""

    name: str


class TemplateBody(TypedDict, total=False):
    """``spec.template`` (upstream form): the worker pods' metadata and scheduling."""

    labels: dict[str, str]
    annotations: dict[str, str]
    nodeSelector: dict[str, str]
    tolerations: list[TolerationBody]
    priorityClassName: str
    nodeAffinity: NodeAffinityBody
    resources: ResourcesBody
    imagePullSecrets: list[LocalObjectReferenceBody]


class GpuSharingBody(TypedDict, total=False):
    """``spec.gpuSharing`` (ours): how workers share a node's GPUs."""

    strategy: str
    """``exclusive`` (default) or ``mps``."""
    clientsPerGpu: int
    gpuCapacity: int


class WorkerPoolSpecBody(TypedDict, total=False):
    """``spec``: flat-form and upstream-form fields side by side."""

    maxWorkers: int
    """Flat form of ``replicas``."""
    replicas: int
    resourceRequests: dict[str, Quantity]
    """Flat form of ``template.resources.requests`` (extended resources imply a limit)."""
    nodeSelector: dict[str, str]
    annotations: dict[str, str]
    runtimeClassName: str
    gpuSharing: GpuSharingBody
    sandboxClass: str
    """``gvisor`` (default) or ``microvm``."""
    workerImage: str
    ateomImage: str
    """Deprecated: upstream's former name of ``workerImage``."""
    sandboxConfigName: str
    maxActorsPerWorker: int
    template: TemplateBody


class WorkerPoolBody(TypedDict, total=False):
    """A whole WorkerPool document."""

    apiVersion: str
    kind: str
    metadata: ObjectMetaBody
    spec: WorkerPoolSpecBody
    status: dict[str, object]
    """Written by the controller; kept as given."""
