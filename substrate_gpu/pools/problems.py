"""What validation reports: problems with a field path, a message and a stable code.

Codes are the join key between the Python validator and the CRD's CEL rules: every
semantic code is enforced by at least one CEL rule carrying the same code, and the
agreement test compares the *sets of codes* both sides report for each case.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from substrate_gpu import exceptions

__all__ = [
    "APISERVER_CODES",
    "STRUCTURAL_CODES",
    "WARNING_CODES",
    "Code",
    "PoolValidationError",
    "Problem",
    "ValidationReport",
]


class Code(StrEnum):
    """Stable identifiers of validation problems."""

    # Structural: enforced by the CRD's openAPIV3Schema (types), not by CEL.
    TYPE = "type"
    UNKNOWN_FIELD = "unknown-field"
    REQUIRED = "required"
    # Semantic: each enforced by CEL rules of the same code.
    POOL_NAME = "pool-name"
    SANDBOX_CLASS = "sandbox-class"
    SHARING_STRATEGY = "sharing-strategy"
    CONFLICTING_FIELDS = "conflicting-fields"
    WORKERS_REQUIRED = "workers-required"
    WORKER_COUNT = "worker-count"
    RESOURCE_COUNT = "resource-count"
    RESOURCE_QUANTITY = "resource-quantity"
    EXTENDED_LIMIT = "extended-limit"
    GPU_SANDBOX_CLASS = "gpu-sandbox-class"
    GPU_RESOURCE_TYPO = "gpu-resource-typo"
    MPS_CLIENTS_REQUIRED = "mps-clients-required"
    MPS_CLIENTS_UNEXPECTED = "mps-clients-unexpected"
    MPS_CLIENTS_RANGE = "mps-clients-range"
    MPS_SINGLE_GPU = "mps-single-gpu"
    SHARING_WITHOUT_GPU = "sharing-without-gpu"
    GPU_OVERSUBSCRIBED = "gpu-oversubscribed"
    RESERVED_KEY = "reserved-key"
    NODE_AFFINITY = "node-affinity"
    # Kubernetes' own object limits: the API server enforces them itself (on the pool's
    # metadata, and on the worker pod the controller renders), not the CRD.
    ANNOTATIONS_TOO_LONG = "annotations-too-long"
    # Warnings: Python only (a CRD's schema and CEL rules cannot warn).
    DISTROLESS_IMAGE = "distroless-image"
    DEPRECATED_FIELD = "deprecated-field"


STRUCTURAL_CODES = frozenset({Code.TYPE, Code.UNKNOWN_FIELD, Code.REQUIRED})
"""Codes the CRD enforces through its schema rather than through CEL."""

WARNING_CODES = frozenset({Code.DISTROLESS_IMAGE, Code.DEPRECATED_FIELD})
"""Codes that never block: ``pool validate`` prints them and the controller's status shows them."""

APISERVER_CODES = frozenset({Code.ANNOTATIONS_TOO_LONG})
"""Codes of limits Kubernetes applies to every object, checked here so ``pool validate``
refuses what the API server would (the pod's annotations only when the pod is created)."""


@dataclass(frozen=True)
class Problem:
    """One thing wrong (or worth a warning) in a WorkerPool document."""

    path: str
    """Field path, e.g. ``spec.template.resources.limits["nvidia.com/gpu"]``."""
    message: str
    """What is wrong and what to do about it."""
    code: Code
    """Stable identifier (see :class:`Code`)."""

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


@dataclass(frozen=True)
class ValidationReport:
    """Everything validation found in one pass: errors block, warnings only inform."""

    errors: tuple[Problem, ...] = ()
    warnings: tuple[Problem, ...] = ()

    @property
    def ok(self) -> bool:
        """Whether the document is acceptable (warnings allowed)."""
        return not self.errors


class PoolValidationError(exceptions.ConfigError):
    """A WorkerPool document is invalid; ``problems`` lists every error found."""

    def __init__(self, source: str, problems: tuple[Problem, ...]) -> None:
        self.source = source
        self.problems = problems
        details = "; ".join(str(p) for p in problems)
        super().__init__(
            f"invalid WorkerPool in {source}: {details} "
            "(run `substrate-gpu pool validate` for the full report)"
        )
