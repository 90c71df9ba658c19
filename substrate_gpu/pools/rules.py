"""The WorkerPool CRD's CEL rules (``x-kubernetes-validations``), as data.

Each rule is the API server's copy of one check of :mod:`.validation`; the two are
written independently on purpose and ``tests/pools/test_cel_agreement.py`` evaluates
every rule here with a real CEL implementation on the validator's own table of cases.

Writing rules that a *standard* CEL evaluator and the API server read alike:

- only standard CEL (``has``, ``in``, ``all``, ``matches``, ``string``, ``int``); no
  Kubernetes extension libraries (``quantity()``, ``format``), so any CEL can check them;
- the rules see the raw object, before defaulting, so every optional field is guarded
  with ``has()`` and defaults (``sandboxClass: gvisor``, ``strategy: exclusive``) are
  spelled out in the rule;
- int-or-string quantities are compared as ``string(v)``: ``1`` and ``"1"`` are the
  same count. Counts are canonical positive integers (no leading zero), checked by
  ``resource-count``, so string equality is numeric equality wherever it matters;
- CEL ``matches`` is a partial match: every pattern is anchored.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from substrate_gpu.pools import model
from substrate_gpu.pools.problems import Code

__all__ = ["COUNT_PATTERN", "QUANTITY_PATTERN", "RULES", "CelRule"]

COUNT_PATTERN = r"^[1-9][0-9]{0,8}$"
"""A positive whole count, at most nine digits (keeps CEL arithmetic within int64)."""

QUANTITY_PATTERN = (
    r"^(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
    r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
"""Kubernetes' resource.Quantity syntax, without a sign (a negative request is refused)."""

RESERVED_DOMAINS = ("ate.dev", "substrate.io")
"""Label and annotation domains only the controller writes (the pool labels live there)."""


@dataclass(frozen=True)
class CelRule:
    """One ``x-kubernetes-validations`` entry."""

    code: Code
    """The validator's code for the same check."""
    scope: Literal["root", "spec"]
    """Where the rule is attached: ``self`` is the whole object or its ``spec``."""
    rule: str
    """The CEL expression; true means valid."""
    message: str
    """What the API server says when the rule is false."""

    def to_validation(self) -> dict[str, str]:
        """The CRD's ``x-kubernetes-validations`` item."""
        return {"rule": self.rule, "message": self.message}


# --- expression builders (strings in, strings out) -----------------------------------

_RR = "self.resourceRequests"
_HAS_RR = "has(self.resourceRequests)"
_RES = "self.template.resources"
_HAS_RES = "has(self.template) && has(self.template.resources)"
_REQ = f"{_RES}.requests"
_HAS_REQ = f"{_HAS_RES} && has({_REQ})"
_LIM = f"{_RES}.limits"
_HAS_LIM = f"{_HAS_RES} && has({_LIM})"
_CLASS = "(has(self.sandboxClass) ? self.sandboxClass : 'gvisor')"
_SHARING = "self.gpuSharing"
_STRATEGY = f"(has({_SHARING}.strategy) ? {_SHARING}.strategy : 'exclusive')"
_CLIENTS = f"{_SHARING}.clientsPerGpu"
_WORKERS = "(has(self.maxWorkers) ? self.maxWorkers : self.replicas)"


def _lit(text: str) -> str:
    """A CEL raw string literal (our patterns and names contain no single quote)."""
    assert "'" not in text
    return f"r'{text}'"


def _is_extended(key: str) -> str:
    return (
        f"({key}.contains('/') && !{key}.contains('kubernetes.io/') "
        f"&& !{key}.startsWith('requests.'))"
    )


def _has_resource(name: str) -> str:
    lit = _lit(name)
    return (
        f"(({_HAS_RR} && {lit} in {_RR}) || ({_HAS_REQ} && {lit} in {_REQ}) "
        f"|| ({_HAS_LIM} && {lit} in {_LIM}))"
    )


def _gpu_value() -> str:
    """The per-worker GPU count as written: limits, else template requests, else flat form."""
    g = _lit(model.GPU_RESOURCE)
    return (
        f"(({_HAS_LIM} && {g} in {_LIM}) ? {_LIM}[{g}] : "
        f"(({_HAS_REQ} && {g} in {_REQ}) ? {_REQ}[{g}] : {_RR}[{g}]))"
    )


def _count_ok(value: str) -> str:
    return f"string({value}).matches({_lit(COUNT_PATTERN)})"


def _in_template(name: str) -> str:
    return f"has(self.template) && has(self.template.{name})"


def _reserved(key: str) -> str:
    parts = []
    for domain in RESERVED_DOMAINS:
        parts += [f"{key}.startsWith('{domain}/')", f"{key}.contains('.{domain}/')"]
    return "(" + " || ".join(parts) + ")"


def _resource_maps() -> list[tuple[str, str, str]]:
    """(has-guard, expression, field path) of the three resource maps."""
    return [
        (_HAS_RR, _RR, "spec.resourceRequests"),
        (_HAS_REQ, _REQ, "spec.template.resources.requests"),
        (_HAS_LIM, _LIM, "spec.template.resources.limits"),
    ]


def _build_rules() -> tuple[CelRule, ...]:
    rules: list[CelRule] = [
        CelRule(
            Code.POOL_NAME,
            "root",
            "!has(self.metadata.name) || self.metadata.name.size() <= 63",
            "metadata.name must be at most 63 characters: it is the value of the "
            "worker-pool label on every worker",
        ),
        CelRule(
            Code.SANDBOX_CLASS,
            "spec",
            "!has(self.sandboxClass) || self.sandboxClass in ['gvisor', 'microvm']",
            "sandboxClass must be 'gvisor' or 'microvm'",
        ),
        CelRule(
            Code.SHARING_STRATEGY,
            "spec",
            f"!has({_SHARING}) || !has({_SHARING}.strategy) "
            f"|| {_SHARING}.strategy in ['exclusive', 'mps']",
            "gpuSharing.strategy must be 'exclusive' or 'mps'",
        ),
        CelRule(
            Code.WORKERS_REQUIRED,
            "spec",
            "has(self.maxWorkers) || has(self.replicas)",
            "set maxWorkers (or replicas): the number of worker pods",
        ),
        CelRule(
            Code.WORKER_COUNT,
            "spec",
            "!has(self.maxWorkers) || self.maxWorkers >= 1",
            "maxWorkers must be at least 1",
        ),
        CelRule(
            Code.WORKER_COUNT,
            "spec",
            "!has(self.replicas) || self.replicas >= 0",
            "replicas must not be negative",
        ),
        CelRule(
            Code.WORKER_COUNT,
            "spec",
            "!has(self.maxActorsPerWorker) "
            "|| (self.maxActorsPerWorker >= 1 && self.maxActorsPerWorker <= 4094)",
            "maxActorsPerWorker must be between 1 and 4094",
        ),
        CelRule(
            Code.WORKER_COUNT,
            "spec",
            f"!has({_SHARING}) || !has({_SHARING}.gpuCapacity) || {_SHARING}.gpuCapacity >= 1",
            "gpuSharing.gpuCapacity must be at least 1",
        ),
    ]
    for flat, upstream, has_upstream in [
        ("maxWorkers", "replicas", "has(self.replicas)"),
        ("resourceRequests", "template.resources", _HAS_RES),
        (
            "nodeSelector",
            "template.nodeSelector",
            "has(self.template) && has(self.template.nodeSelector)",
        ),
        (
            "annotations",
            "template.annotations",
            "has(self.template) && has(self.template.annotations)",
        ),
    ]:
        rules.append(
            CelRule(
                Code.CONFLICTING_FIELDS,
                "spec",
                f"!(has(self.{flat}) && {has_upstream})",
                f"set either {flat} (flat form) or {upstream} (upstream form), not both",
            )
        )
    for has_map, expr, path in _resource_maps():
        rules.append(
            CelRule(
                Code.RESOURCE_COUNT,
                "spec",
                f"!({has_map}) || {expr}.all(k, !{_is_extended('k')} || {_count_ok(f'{expr}[k]')})",
                f"{path}: extended resources (such as nvidia.com/gpu) must be positive "
                "whole numbers",
            )
        )
        rules.append(
            CelRule(
                Code.RESOURCE_QUANTITY,
                "spec",
                f"!({has_map}) || {expr}.all(k, {_is_extended('k')} "
                f"|| string({expr}[k]).matches({_lit(QUANTITY_PATTERN)}))",
                f"{path}: values must be Kubernetes quantities such as 500m, 2 or 4Gi",
            )
        )
    rules.append(
        CelRule(
            Code.EXTENDED_LIMIT,
            "spec",
            f"!({_HAS_REQ}) || {_REQ}.all(k, !{_is_extended('k')} "
            f"|| (({_HAS_LIM}) && k in {_LIM} && string({_LIM}[k]) == string({_REQ}[k])))",
            "Kubernetes admits a request for an extended resource (such as nvidia.com/gpu) "
            "only with an equal limit: set template.resources.limits to the same count",
        )
    )
    for resource, support in model.GPU_RESOURCES.items():
        if support.sandbox_classes:
            classes = ", ".join(f"'{c}'" for c in sorted(support.sandbox_classes))
            rule = f"!{_has_resource(resource)} || {_CLASS} in [{classes}]"
        else:
            rule = f"!{_has_resource(resource)}"
        rules.append(
            CelRule(Code.GPU_SANDBOX_CLASS, "spec", rule, model.gpu_support_message(resource))
        )
    has_gpu = _has_resource(model.GPU_RESOURCE)
    gpu = _gpu_value()
    rules += [
        CelRule(
            Code.MPS_CLIENTS_REQUIRED,
            "spec",
            f"!has({_SHARING}) || {_STRATEGY} != 'mps' || has({_CLIENTS})",
            "gpuSharing.strategy mps needs gpuSharing.clientsPerGpu (workers per GPU)",
        ),
        CelRule(
            Code.MPS_CLIENTS_UNEXPECTED,
            "spec",
            f"!has({_SHARING}) || !has({_CLIENTS}) || {_STRATEGY} == 'mps'",
            "gpuSharing.clientsPerGpu is only meaningful with strategy mps",
        ),
        CelRule(
            Code.MPS_CLIENTS_RANGE,
            "spec",
            f"!has({_SHARING}) || !has({_CLIENTS}) || ({_CLIENTS} >= 2 && {_CLIENTS} <= 48)",
            "gpuSharing.clientsPerGpu must be between 2 and 48 (NVIDIA MPS's client limit)",
        ),
        CelRule(
            Code.MPS_SINGLE_GPU,
            "spec",
            f"!has({_SHARING}) || {_STRATEGY} != 'mps' || !{has_gpu} || string({gpu}) == '1'",
            "with gpuSharing.strategy mps a worker requests exactly 1 nvidia.com/gpu: the "
            "NVIDIA device plugin refuses more than one shared GPU per container",
        ),
        CelRule(
            Code.SHARING_WITHOUT_GPU,
            "spec",
            f"!has({_SHARING}) || {has_gpu}",
            "gpuSharing is set but the pool requests no nvidia.com/gpu",
        ),
        CelRule(
            Code.GPU_OVERSUBSCRIBED,
            "spec",
            f"!has({_SHARING}) || !has({_SHARING}.gpuCapacity) || !{has_gpu} "
            f"|| !{_count_ok(gpu)} || !(has(self.maxWorkers) || has(self.replicas)) "
            f"|| !({_STRATEGY} == 'exclusive' || ({_STRATEGY} == 'mps' && has({_CLIENTS}))) "
            f"|| {_WORKERS} * int(string({gpu})) <= {_SHARING}.gpuCapacity "
            f"* ({_STRATEGY} == 'mps' ? {_CLIENTS} : 1)",
            "the pool's workers need more GPUs than gpuSharing.gpuCapacity provides: "
            "lower maxWorkers, or share GPUs with strategy mps",
        ),
    ]
    for has_map, expr, path in [
        ("has(self.annotations)", "self.annotations", "spec.annotations"),
        (
            "has(self.template) && has(self.template.annotations)",
            "self.template.annotations",
            "spec.template.annotations",
        ),
        (
            "has(self.template) && has(self.template.labels)",
            "self.template.labels",
            "spec.template.labels",
        ),
    ]:
        rules.append(
            CelRule(
                Code.RESERVED_KEY,
                "spec",
                f"!({has_map}) || {expr}.all(k, !{_reserved('k')})",
                f"{path}: keys in the ate.dev and substrate.io domains are reserved for the "
                "controller",
            )
        )
    return tuple(rules)


RULES: tuple[CelRule, ...] = _build_rules()
"""Every CEL rule of the WorkerPool CRD."""
