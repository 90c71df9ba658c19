"""WorkerPools on the controller side: model, validation, worker pod shaping, CRD, manifests.

Module map:

- :mod:`.model`: the frozen :class:`WorkerPool` and how both YAML forms normalise into it
  (and back: :meth:`WorkerPool.to_document`, for pools built in Python);
- :mod:`.schema`: the structural field tree (shared by the validator and the CRD);
- :mod:`.validation` and :mod:`.problems`: every problem in one pass, with field paths;
- :mod:`.rules`: the CRD's CEL rules, the API server's copy of the validator;
- :mod:`.shaping`: the worker Deployment and its GPU shape;
- :mod:`.worker_pod`: what every worker pod gets, as upstream's controller gives it
  (security context, grace, rollout, sandbox-class toleration);
- :mod:`.worker_agent`: how the agent runs in a GPU worker (command, state, probes);
- :mod:`.crd` and :mod:`.manifests`: CRD generation, YAML in and out, ``deploy/``.
"""

from __future__ import annotations

from substrate_gpu.pools.crd import render_crd
from substrate_gpu.pools.manifests import (
    PoolDocument,
    PoolFileError,
    dump_documents,
    parse_documents,
    read_documents,
)
from substrate_gpu.pools.model import (
    API_VERSION,
    GPU_RESOURCE,
    KIND,
    POOL_LABEL,
    UPSTREAM_POOL_LABEL,
    GpuSharing,
    NodeAffinity,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    PreferredSchedulingTerm,
    Toleration,
    WorkerPool,
)
from substrate_gpu.pools.problems import Code, PoolValidationError, Problem, ValidationReport
from substrate_gpu.pools.shaping import (
    ControllerSettings,
    maybe_shape_for_gpu,
    render_worker_deployment,
)
from substrate_gpu.pools.validation import load_pool, validate_document

__all__ = [
    "API_VERSION",
    "GPU_RESOURCE",
    "KIND",
    "POOL_LABEL",
    "UPSTREAM_POOL_LABEL",
    "Code",
    "ControllerSettings",
    "GpuSharing",
    "NodeAffinity",
    "NodeSelectorRequirement",
    "NodeSelectorTerm",
    "PoolDocument",
    "PoolFileError",
    "PoolValidationError",
    "PreferredSchedulingTerm",
    "Problem",
    "Toleration",
    "ValidationReport",
    "WorkerPool",
    "dump_documents",
    "load_pool",
    "maybe_shape_for_gpu",
    "parse_documents",
    "read_documents",
    "render_crd",
    "render_worker_deployment",
    "validate_document",
]
