"""One table of WorkerPool cases, shared by the Python validator's tests and the CEL tests.

``SEMANTIC_CASES`` are schema-valid documents with the set of codes both the Python
validator and the CRD's CEL rules must report (and the API server must answer with the
validator's messages on the validator's fields); ``STRUCTURAL_CASES`` are schema-invalid
documents, with the schema check that rejects each before any CEL rule runs.
"""

from __future__ import annotations

from typing import Any

import pytest

from substrate_gpu.pools import API_VERSION, KIND
from substrate_gpu.pools.problems import Code

IMAGE = "ghcr.io/example/ateom:v1"


def pool(spec: dict[str, Any], *, name: str = "p") -> dict[str, Any]:
    """A WorkerPool document with ``spec``."""
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": name}, "spec": spec}


def flat(gpus: object = "1", **extra: Any) -> dict[str, Any]:
    """A flat-form spec with ``gpus`` nvidia.com/gpu per worker and 2 workers."""
    return {"resourceRequests": {"nvidia.com/gpu": gpus}, "maxWorkers": 2, **extra}


def upstream(
    requests: dict[str, Any] | None = None, limits: dict[str, Any] | None = None, **extra: Any
) -> dict[str, Any]:
    """An upstream-form spec with the given template resources and 1 replica."""
    resources: dict[str, Any] = {}
    if requests is not None:
        resources["requests"] = requests
    if limits is not None:
        resources["limits"] = limits
    return {"replicas": 1, "workerImage": IMAGE, "template": {"resources": resources}, **extra}


def sharing(**settings: Any) -> dict[str, Any]:
    return {"gpuSharing": settings}


def affinity(**node_affinity: Any) -> dict[str, Any]:
    """A CPU upstream-form spec whose template has ``node_affinity``."""
    spec = upstream({"cpu": 1})
    spec["template"]["nodeAffinity"] = node_affinity
    return spec


def required(*expressions: dict[str, Any], fields: list[dict[str, Any]] | None = None) -> dict:
    """``requiredDuringScheduling…`` with one term of ``expressions`` (and ``fields``)."""
    term: dict[str, Any] = {"matchExpressions": list(expressions)}
    if fields is not None:
        term["matchFields"] = fields
    return {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}


def preferred(weight: int, *expressions: dict[str, Any]) -> dict:
    """``preferredDuringScheduling…`` with one weighted term of ``expressions``."""
    return {
        "preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": weight, "preference": {"matchExpressions": list(expressions)}}
        ]
    }


def req(key: str, operator: str, *values: str) -> dict[str, Any]:
    """A node selector requirement."""
    out: dict[str, Any] = {"key": key, "operator": operator}
    if values:
        out["values"] = list(values)
    return out


G = "nvidia.com/gpu"
W1 = {"maxWorkers": 1}
OTHER_GPUS = {"amd.com/gpu": 1, "gpu.intel.com/i915": 1, "gpu.intel.com/xe": 1}
TYPOS = ("nvidia.com/gpus", "amd.com/gpus", "gpu.intel.com/i916", "gpu.intel.com/xee")
"""One misspelling of each recognised GPU resource."""

SEMANTIC_CASES = [
    # --- accepted as written ---------------------------------------------------------
    # The user's documented YAML must be accepted verbatim (brief §6).
    pytest.param(
        pool(
            {
                "nodeSelector": {"accelerator": "nvidia-gpu"},
                "resourceRequests": {G: "1"},
                "maxWorkers": 10,
            },
            name="gpu-pool",
        ),
        set(),
        id="user-documented-pool",
    ),
    # Upstream form with request equal to limit, int and string spellings mixed.
    pytest.param(pool(upstream({G: 1}, {G: "1"})), set(), id="upstream-request-equals-limit"),
    # A limit alone is fine: Kubernetes defaults the request to it.
    pytest.param(pool(upstream(None, {G: 2})), set(), id="upstream-limit-only"),
    # Native resources need no limit.
    pytest.param(pool(upstream({"cpu": "500m", "memory": "1Gi"})), set(), id="cpu-pool"),
    # A micro-VM pool without GPUs is untouched by the GPU rules.
    pytest.param(pool(upstream({"cpu": 1}, sandboxClass="microvm")), set(), id="microvm-cpu"),
    # Scale to zero stays possible (upstream's Minimum=0).
    pytest.param(pool(upstream(None, {G: 1}) | {"replicas": 0}), set(), id="zero-replicas"),
    # An unknown vendor's extended resource is just an extended resource.
    pytest.param(
        pool(upstream({"example.com/fpga": 1}, {"example.com/fpga": 1})),
        set(),
        id="other-extended-resource",
    ),
    # The user's flat form implies limits = requests, so no extended-limit error.
    pytest.param(pool(flat("2")), set(), id="flat-form-implies-limit"),
    # Exactly filling the GPUs is not oversubscribing: 4 workers x 2 GPUs = 8.
    pytest.param(
        pool(flat("2", maxWorkers=4) | sharing(gpuCapacity=8)), set(), id="exclusive-exactly-full"
    ),
    # MPS: 16 workers on 4 GPUs shared by 4 clients each.
    pytest.param(
        pool(flat(maxWorkers=16) | sharing(strategy="mps", clientsPerGpu=4, gpuCapacity=4)),
        set(),
        id="mps-exactly-full",
    ),
    # A look-alike domain is not reserved.
    pytest.param(pool(flat(annotations={"notate.dev/x": "1"})), set(), id="lookalike-domain"),
    # --- GPU support per sandbox class (written positively) --------------------------
    # The rule keys off limits...
    pytest.param(
        pool(upstream(None, {G: 1}, sandboxClass="microvm")),
        {Code.GPU_SANDBOX_CLASS},
        id="gpu-limit-on-microvm",
    ),
    # ...or requests (which also lacks its limit here).
    pytest.param(
        pool(upstream({G: 1}, None, sandboxClass="microvm")),
        {Code.GPU_SANDBOX_CLASS, Code.EXTENDED_LIMIT},
        id="gpu-request-on-microvm",
    ),
    # ...or the flat form.
    pytest.param(
        pool(flat(sandboxClass="microvm")), {Code.GPU_SANDBOX_CLASS}, id="flat-gpu-on-microvm"
    ),
    # A class nobody opted in for GPUs gets none (and is not a class at all).
    pytest.param(
        pool(flat(sandboxClass="kata")),
        {Code.SANDBOX_CLASS, Code.GPU_SANDBOX_CLASS},
        id="gpu-on-unknown-class",
    ),
    pytest.param(
        pool(upstream({"cpu": 1}, sandboxClass="kata")), {Code.SANDBOX_CLASS}, id="unknown-class"
    ),
    # Other vendors are recognised and refused, never silently accepted.
    pytest.param(
        pool(upstream(None, {"amd.com/gpu": 1})), {Code.GPU_SANDBOX_CLASS}, id="amd-on-gvisor"
    ),
    pytest.param(
        pool(upstream(None, {"gpu.intel.com/i915": 1})),
        {Code.GPU_SANDBOX_CLASS},
        id="intel-on-gvisor",
    ),
    pytest.param(
        pool(upstream(None, {"amd.com/gpu": 1}, sandboxClass="microvm")),
        {Code.GPU_SANDBOX_CLASS},
        id="amd-on-microvm",
    ),
    pytest.param(
        pool(upstream(None, {"gpu.intel.com/xe": 1})),
        {Code.GPU_SANDBOX_CLASS},
        id="intel-xe-on-gvisor",
    ),
    # Each map is checked for each vendor (the problem names the map it is written in).
    pytest.param(
        pool({"resourceRequests": {"gpu.intel.com/i915": "1", "gpu.intel.com/xe": "1"}} | W1),
        {Code.GPU_SANDBOX_CLASS},
        id="intel-flat",
    ),
    pytest.param(
        pool(upstream(OTHER_GPUS, OTHER_GPUS)),
        {Code.GPU_SANDBOX_CLASS},
        id="other-vendors-in-requests-and-limits",
    ),
    # --- a GPU resource one edit from a recognised name is a typo, never a CPU pool --------
    # Kubernetes would take nvidia.com/gpus as another extended resource: no GPU, no GPU
    # shaping, workers Pending (or worse, running without a GPU) and a "Ready" pool.
    pytest.param(
        pool(
            {
                "nodeSelector": {"accelerator": "nvidia-gpu"},
                "resourceRequests": {"nvidia.com/gpus": "1"},
                "maxWorkers": 10,
            },
            name="gpu-pool",
        ),
        {Code.GPU_RESOURCE_TYPO},
        id="user-documented-pool-with-gpus-typo",
    ),
    pytest.param(
        pool(upstream({"nvidia.com/gup": 1}, {"nvidia.com/gup": 1})),
        {Code.GPU_RESOURCE_TYPO},
        id="gpu-swapped-letters-in-requests-and-limits",
    ),
    pytest.param(
        pool(upstream(None, {"nvidia.com/gp": 1})),
        {Code.GPU_RESOURCE_TYPO},
        id="gpu-letter-dropped",
    ),
    pytest.param(
        pool(upstream(None, {"nvidia.com/cpu": 1})),
        {Code.GPU_RESOURCE_TYPO},
        id="gpu-letter-replaced",
    ),
    # Resource names are case-sensitive: a capitalised name is another resource.
    pytest.param(
        pool(upstream(None, {"NVIDIA.com/GPU": 1})),
        {Code.GPU_RESOURCE_TYPO},
        id="gpu-upper-case",
    ),
    # The right name beside the misspelt one does not excuse it.
    pytest.param(
        pool(upstream(None, {G: 1, "nvidia.com/gpu0": 1})),
        {Code.GPU_RESOURCE_TYPO},
        id="gpu-and-a-typo",
    ),
    # Other vendors' names are recognised too (and refused on their own).
    pytest.param(
        pool(upstream(None, {"amd.com/gpus": 1})), {Code.GPU_RESOURCE_TYPO}, id="amd-typo"
    ),
    pytest.param(
        pool(upstream(None, {"gpu.intel.com/i91": 1})), {Code.GPU_RESOURCE_TYPO}, id="intel-typo"
    ),
    # Each recognised name, in each map, is checked (each problem names its map).
    pytest.param(
        pool({"resourceRequests": dict.fromkeys(TYPOS, "1")} | W1),
        {Code.GPU_RESOURCE_TYPO},
        id="typos-of-every-vendor-flat",
    ),
    pytest.param(
        pool(upstream(dict.fromkeys(TYPOS, 1), dict.fromkeys(TYPOS, 1))),
        {Code.GPU_RESOURCE_TYPO},
        id="typos-of-every-vendor-upstream",
    ),
    # Two edits away is another resource, not a typo (the device plugin's shared GPUs,
    # MIG slices, unrelated vendors).
    pytest.param(
        pool(upstream(None, {"nvidia.com/gpu.shared": 1, "nvidia.com/mig-1g.5gb": 1})),
        set(),
        id="other-nvidia-resources",
    ),
    pytest.param(
        pool(upstream(None, {"example.com/gpux2": 1})), set(), id="unrelated-extended-resource"
    ),
    # --- the worker image: workerImage, or its deprecated name, not both -----------------
    pytest.param(pool(flat(workerImage=IMAGE)), set(), id="worker-image"),
    pytest.param(pool(flat(ateomImage=IMAGE)), set(), id="deprecated-ateom-image"),
    pytest.param(
        pool(flat(workerImage=IMAGE, ateomImage=IMAGE)),
        {Code.CONFLICTING_FIELDS},
        id="both-image-names",
    ),
    # --- node affinity: what Kubernetes would refuse in the worker pod ------------------
    pytest.param(
        pool(
            affinity(
                **required(req("zone", "In", "a", "b"), req("gpu", "Exists")),
                **preferred(100, req("cores", "Gt", "8"), req("spot", "DoesNotExist")),
            )
        ),
        set(),
        id="node-affinity",
    ),
    pytest.param(
        pool(affinity(**required(fields=[req("metadata.name", "In", "node-1")]))),
        set(),
        id="node-affinity-field",
    ),
    pytest.param(
        pool(affinity(**preferred(0, req("zone", "In", "a")))),
        {Code.NODE_AFFINITY},
        id="node-affinity-zero-weight",
    ),
    pytest.param(
        pool(affinity(**preferred(101, req("zone", "In", "a")))),
        {Code.NODE_AFFINITY},
        id="node-affinity-weight-over-100",
    ),
    pytest.param(
        pool(affinity(**required(req("zone", "In")))),
        {Code.NODE_AFFINITY},
        id="node-affinity-in-without-values",
    ),
    pytest.param(
        pool(affinity(**required(req("gpu", "Exists", "yes")))),
        {Code.NODE_AFFINITY},
        id="node-affinity-exists-with-values",
    ),
    pytest.param(
        pool(affinity(**preferred(1, req("cores", "Gt", "eight")))),
        {Code.NODE_AFFINITY},
        id="node-affinity-gt-not-a-number",
    ),
    pytest.param(
        pool(affinity(**required(req("cores", "Lt", "1", "2")))),
        {Code.NODE_AFFINITY},
        id="node-affinity-lt-two-values",
    ),
    pytest.param(
        pool(affinity(**required(fields=[req("metadata.labels", "In", "x")]))),
        {Code.NODE_AFFINITY},
        id="node-affinity-field-not-name",
    ),
    pytest.param(
        pool(affinity(**required(fields=[req("metadata.name", "In", "a", "b")]))),
        {Code.NODE_AFFINITY},
        id="node-affinity-field-two-values",
    ),
    # --- Kubernetes' extended-resource rule ------------------------------------------
    pytest.param(pool(upstream({G: 1}, None)), {Code.EXTENDED_LIMIT}, id="request-without-limit"),
    pytest.param(
        pool(upstream({G: 1}, {"cpu": 1})), {Code.EXTENDED_LIMIT}, id="request-without-gpu-limit"
    ),
    pytest.param(pool(upstream({G: 1}, {G: 2})), {Code.EXTENDED_LIMIT}, id="request-not-limit"),
    # --- counts and quantities -------------------------------------------------------
    pytest.param(pool(flat("0")), {Code.RESOURCE_COUNT}, id="zero-gpus"),
    pytest.param(pool(flat(-1)), {Code.RESOURCE_COUNT}, id="negative-gpus"),
    pytest.param(pool(flat("1.5")), {Code.RESOURCE_COUNT}, id="fractional-gpus"),
    pytest.param(pool(flat("01")), {Code.RESOURCE_COUNT}, id="leading-zero-gpus"),
    pytest.param(pool(flat("1k")), {Code.RESOURCE_COUNT}, id="suffixed-gpus"),
    pytest.param(pool(upstream({G: "0"}, {G: 0})), {Code.RESOURCE_COUNT}, id="zero-gpus-upstream"),
    pytest.param(pool(upstream({"cpu": "lots"})), {Code.RESOURCE_QUANTITY}, id="bad-cpu"),
    pytest.param(
        pool(upstream(None, {"memory": "1 Gi"})), {Code.RESOURCE_QUANTITY}, id="bad-memory-limit"
    ),
    pytest.param(
        pool(upstream({"memory": "-1Gi"})), {Code.RESOURCE_QUANTITY}, id="negative-memory"
    ),
    pytest.param(pool(flat(maxWorkers=0)), {Code.WORKER_COUNT}, id="zero-max-workers"),
    pytest.param(
        pool(upstream({"cpu": 1}) | {"replicas": -1}), {Code.WORKER_COUNT}, id="negative-replicas"
    ),
    pytest.param(pool(flat(maxActorsPerWorker=0)), {Code.WORKER_COUNT}, id="zero-actors"),
    pytest.param(
        pool({"resourceRequests": {G: "1"}}), {Code.WORKERS_REQUIRED}, id="no-worker-count"
    ),
    # --- one form or the other, never a merge ----------------------------------------
    pytest.param(pool(flat(replicas=2)), {Code.CONFLICTING_FIELDS}, id="max-workers-and-replicas"),
    pytest.param(
        pool(upstream(None, {G: 1}, resourceRequests={G: "1"})),
        {Code.CONFLICTING_FIELDS},
        id="both-resource-forms",
    ),
    pytest.param(
        pool(flat(nodeSelector={"a": "b"}, template={"nodeSelector": {"a": "b"}})),
        {Code.CONFLICTING_FIELDS},
        id="both-node-selectors",
    ),
    pytest.param(
        pool(flat(annotations={"a": "b"}, template={"annotations": {"a": "b"}})),
        {Code.CONFLICTING_FIELDS},
        id="both-annotations",
    ),
    # --- exclusive GPUs must not be oversubscribed -----------------------------------
    pytest.param(
        pool(flat(maxWorkers=10) | sharing(gpuCapacity=8)),
        {Code.GPU_OVERSUBSCRIBED},
        id="exclusive-oversubscribed",
    ),
    pytest.param(
        pool(flat("2", maxWorkers=5) | sharing(strategy="exclusive", gpuCapacity=8)),
        {Code.GPU_OVERSUBSCRIBED},
        id="exclusive-multi-gpu-oversubscribed",
    ),
    pytest.param(
        pool(upstream(None, {G: 1}) | {"replicas": 9} | sharing(gpuCapacity=8)),
        {Code.GPU_OVERSUBSCRIBED},
        id="replicas-oversubscribed",
    ),
    pytest.param(
        pool(flat() | sharing(gpuCapacity=0)),
        {Code.WORKER_COUNT, Code.GPU_OVERSUBSCRIBED},
        id="zero-capacity",
    ),
    # --- MPS consistency -------------------------------------------------------------
    pytest.param(
        pool(flat(maxWorkers=17) | sharing(strategy="mps", clientsPerGpu=4, gpuCapacity=4)),
        {Code.GPU_OVERSUBSCRIBED},
        id="mps-oversubscribed",
    ),
    pytest.param(
        pool(flat() | sharing(strategy="mps")),
        {Code.MPS_CLIENTS_REQUIRED},
        id="mps-without-clients",
    ),
    pytest.param(
        pool(flat() | sharing(strategy="mps", gpuCapacity=1)),
        {Code.MPS_CLIENTS_REQUIRED},
        id="mps-without-clients-with-capacity",
    ),
    pytest.param(
        pool(flat() | sharing(clientsPerGpu=4)),
        {Code.MPS_CLIENTS_UNEXPECTED},
        id="clients-without-mps",
    ),
    pytest.param(
        pool(flat() | sharing(strategy="mps", clientsPerGpu=1)),
        {Code.MPS_CLIENTS_RANGE},
        id="one-mps-client",
    ),
    pytest.param(
        pool(flat() | sharing(strategy="mps", clientsPerGpu=49)),
        {Code.MPS_CLIENTS_RANGE},
        id="too-many-mps-clients",
    ),
    pytest.param(
        pool(flat("2") | sharing(strategy="mps", clientsPerGpu=2)),
        {Code.MPS_SINGLE_GPU},
        id="mps-two-gpus",
    ),
    pytest.param(
        pool(upstream({"cpu": 1}) | sharing(strategy="mps", clientsPerGpu=2)),
        {Code.SHARING_WITHOUT_GPU},
        id="sharing-without-gpu",
    ),
    pytest.param(
        pool(flat() | sharing(strategy="timeslice")), {Code.SHARING_STRATEGY}, id="unknown-strategy"
    ),
    pytest.param(
        pool(flat() | sharing(strategy="timeslice", clientsPerGpu=2)),
        {Code.SHARING_STRATEGY, Code.MPS_CLIENTS_UNEXPECTED},
        id="unknown-strategy-with-clients",
    ),
    # --- names and reserved keys -----------------------------------------------------
    pytest.param(pool(flat(), name="p" * 64), {Code.POOL_NAME}, id="name-too-long"),
    pytest.param(
        pool(flat(annotations={"ate.dev/worker-pool": "x"})),
        {Code.RESERVED_KEY},
        id="reserved-annotation",
    ),
    pytest.param(
        pool(upstream({"cpu": 1}) | {"template": {"labels": {"substrate.io/worker-pool": "x"}}}),
        {Code.RESERVED_KEY},
        id="reserved-label",
    ),
    pytest.param(
        pool(flat(annotations={"x.ate.dev/y": "1"})), {Code.RESERVED_KEY}, id="reserved-subdomain"
    ),
    pytest.param(
        pool(upstream({"cpu": 1}) | {"template": {"annotations": {"ate.dev/x": "y"}}}),
        {Code.RESERVED_KEY},
        id="reserved-template-annotation",
    ),
    # --- everything at once: one pass reports all ------------------------------------
    pytest.param(
        pool(
            {
                "resourceRequests": {"amd.com/gpu": "1", G: "0", "cpu": "x"},
                "maxWorkers": 0,
                "replicas": 1,
                "sandboxClass": "microvm",
                "gpuSharing": {"clientsPerGpu": 99},
            },
            name="q" * 70,
        ),
        {
            Code.GPU_SANDBOX_CLASS,
            Code.RESOURCE_COUNT,
            Code.RESOURCE_QUANTITY,
            Code.WORKER_COUNT,
            Code.CONFLICTING_FIELDS,
            Code.MPS_CLIENTS_UNEXPECTED,
            Code.MPS_CLIENTS_RANGE,
            Code.POOL_NAME,
        },
        id="many-problems-one-pass",
    ),
]

STRUCTURAL_CASES = [
    # The API server decides these before any CEL rule runs (CEL only ever sees well-typed
    # objects), so its message is its own, not the validator's; the third value names the
    # check that refuses each, and the API server test holds it to that check, on the field
    # the validator names.
    # Counts are integers, not strings (only quantities are int-or-string).
    pytest.param(pool(flat(maxWorkers="10")), {Code.TYPE}, "type", id="string-max-workers"),
    # YAML's true is not 1.
    pytest.param(pool(flat(True)), {Code.TYPE}, "type", id="bool-gpus"),
    pytest.param(pool(flat(1.5)), {Code.TYPE}, "type", id="float-gpus"),
    pytest.param(
        pool({"resourceRequests": ["nvidia.com/gpu"], "maxWorkers": 1}),
        {Code.TYPE},
        "type",
        id="list-resources",
    ),
    pytest.param(
        pool(
            upstream({"cpu": 1})
            | {"template": {"tolerations": [{"key": "nvidia.com/gpu", "operator": "Maybe"}]}}
        ),
        {Code.TYPE},
        "enum",
        id="bad-toleration-operator",
    ),
    pytest.param(pool(flat(workerImage="")), {Code.TYPE}, "minLength", id="empty-image"),
    pytest.param(pool(flat(ateomImage="")), {Code.TYPE}, "minLength", id="empty-deprecated-image"),
    pytest.param(
        pool(affinity(**required(req("zone", "Near", "a")))),
        {Code.TYPE},
        "enum",
        id="node-affinity-unknown-operator",
    ),
    pytest.param(
        pool(affinity(requiredDuringSchedulingIgnoredDuringExecution={"nodeSelectorTerms": []})),
        {Code.TYPE},
        "minItems",
        id="node-affinity-no-required-terms",
    ),
    pytest.param(
        pool(affinity(preferredDuringSchedulingIgnoredDuringExecution=[{"weight": 1}])),
        {Code.REQUIRED},
        "required",
        id="node-affinity-preference-missing",
    ),
    pytest.param(
        pool(upstream({"cpu": 1}) | {"template": {"imagePullSecrets": [{}]}}),
        {Code.REQUIRED},
        "required",
        id="pull-secret-without-name",
    ),
    pytest.param(pool(flat(nodeSelector={"a": 1})), {Code.TYPE}, "type", id="int-label-value"),
    # Quantities are bounded (the API server's CEL cost estimate depends on it).
    pytest.param(pool(flat("1" * 65)), {Code.TYPE}, "maxLength", id="overlong-quantity"),
    pytest.param(
        {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": "p"}},
        {Code.REQUIRED},
        "required",
        id="missing-spec",
    ),
    # A misspelt field: the schema would prune it; strict field validation (kubectl's
    # default) refuses the request while decoding it.
    pytest.param(pool(flat(maxWorker=3)), {Code.UNKNOWN_FIELD}, "unknown", id="misspelt-field"),
]
