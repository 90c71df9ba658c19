"""The WorkerPool CRD's CEL rules (``x-kubernetes-validations``) and their messages, as data.

Each rule is the API server's copy of one check of :mod:`.validation`. The *checks* are
written twice on purpose (Python here in the validator, CEL below) and
``tests/pools/test_cel_agreement.py`` evaluates every rule with a real CEL implementation
on the validator's own table of cases. The *messages* are written once: each rule carries
a :class:`Message`, the validator formats the same :class:`Message` for the same problem,
and the rule's ``fieldPath`` is the field the validator names. So ``kubectl apply`` and
``substrate-gpu pool validate`` say the same thing about the same field;
``tests/kube/test_crd_on_apiserver.py`` holds the real API server to it, case by case.

A message that shows values (an offending key, the GPU arithmetic) is a template: the
validator fills it with ``str.format`` and the API server builds it from the same
template through a ``messageExpression`` (:meth:`Message.cel`). Lists of keys are
chosen the same way on both sides: the first in key order.

Writing rules that a *standard* CEL evaluator and the API server read alike:

- the rules use only standard CEL (``has``, ``in``, ``all``, ``filter``, ``matches``,
  ``string``, ``int``), no Kubernetes extension library, so any CEL can check them. Only
  the ``messageExpression`` of a failing rule uses Kubernetes' list extension
  (``sort()``), and only the API server builds those;
- the rules see the raw object, before defaulting, so every optional field is guarded
  with ``has()`` and defaults (``sandboxClass: gvisor``, ``strategy: exclusive``) are
  spelled out in the rule;
- int-or-string quantities are compared as ``string(v)``: ``1`` and ``"1"`` are the
  same count. Counts are canonical positive integers (no leading zero), checked by
  ``resource-count``, so string equality is numeric equality wherever it matters;
- CEL ``matches`` is a partial match: every pattern is anchored.
"""

from __future__ import annotations

import re
import string
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from substrate_gpu.pools import model
from substrate_gpu.pools.problems import Code

__all__ = [
    "ACTORS_RANGE",
    "AT_LEAST_ONE",
    "COUNT_PATTERN",
    "EXTENDED_LIMIT",
    "GPU_OVERSUBSCRIBED",
    "GPU_TYPO",
    "IMAGE_BOTH_NAMES",
    "MPS_CLIENTS_MISSING",
    "MPS_CLIENTS_RANGE",
    "MPS_CLIENTS_WITHOUT_MPS",
    "MPS_ONE_GPU",
    "NODE_FIELD_REQUIREMENT",
    "NODE_LABEL_REQUIREMENT",
    "NODE_WEIGHT",
    "NOT_NEGATIVE",
    "POOL_NAME_TOO_LONG",
    "QUANTITY_PATTERN",
    "RESERVED_DOMAINS",
    "RESERVED_KEYS",
    "RESOURCE_COUNT",
    "RESOURCE_QUANTITY",
    "RULES",
    "SANDBOX_CLASS_UNKNOWN",
    "SHARING_STRATEGY_UNKNOWN",
    "SHARING_WITHOUT_GPU",
    "WORKERS_MISSING",
    "CelRule",
    "Message",
    "conflict_message",
    "field_requirement_ok",
    "first_entry",
    "first_key",
    "gpu_support_message",
    "gpu_typo_pattern",
    "integer_value",
    "label_requirement_ok",
]

COUNT_PATTERN = r"^[1-9][0-9]{0,8}$"
"""A positive whole count, at most nine digits (keeps CEL arithmetic within int64)."""

QUANTITY_PATTERN = (
    r"^(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
    r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
"""Kubernetes' resource.Quantity syntax, without a sign (a negative request is refused)."""

INTEGER_PATTERN = r"^-?[0-9]+$"
"""A node selector's Gt/Lt value: a whole number (Kubernetes parses it as int64)."""

RESERVED_DOMAINS = ("ate.dev", "substrate.io")
"""Label and annotation domains only the controller writes (the pool labels live there)."""


@dataclass(frozen=True)
class Message:
    """One problem's text, for the validator (:meth:`format`) and the API server (:meth:`cel`)."""

    template: str
    """The text; ``{name}`` placeholders are filled with values (none: a fixed message)."""
    cel_values: Mapping[str, str] = field(default_factory=dict)
    """A CEL expression per placeholder (printed with ``%s``), evaluated on the rule's ``self``."""

    def __post_init__(self) -> None:
        if set(self.placeholders) != set(self.cel_values):
            raise ValueError(f"placeholders and CEL values differ in {self.template!r}")

    @property
    def placeholders(self) -> tuple[str, ...]:
        """The placeholder names, in order."""
        return tuple(name for _, name, _, _ in string.Formatter().parse(self.template) if name)

    def format(self, **values: object) -> str:
        """The validator's text."""
        return self.template.format(**values)

    def cel(self) -> str:
        """The ``messageExpression``: the template as one ``format()`` call.

        One call, not a concatenation: the API server's cost estimator bounds the result
        of ``format()`` but not of ``string(int)``, and refuses a concatenation with it.
        """
        text, values = "", []
        for literal, name, _, _ in string.Formatter().parse(self.template):
            text += literal.replace("%", "%%")
            if name:
                text += "%s"
                values.append(self.cel_values[name])
        return f"{_str_lit(text)}.format([{', '.join(values)}])"

    def to_validation(self) -> dict[str, str]:
        """``message`` (fixed text) or ``messageExpression`` (a template with values)."""
        if self.cel_values:
            return {"messageExpression": self.cel()}
        return {"message": self.template}


@dataclass(frozen=True)
class CelRule:
    """One ``x-kubernetes-validations`` entry."""

    code: Code
    """The validator's code for the same check."""
    scope: Literal["root", "spec"]
    """Where the rule is attached: ``self`` is the whole object or its ``spec``."""
    rule: str
    """The CEL expression; true means valid."""
    message: Message
    """What the API server (and the validator) says when the rule is false."""
    field: str
    """The field the problem is reported on, relative to ``scope`` (``""``: the scope itself);
    the validator reports the same path."""

    @property
    def path(self) -> str:
        """The field's full path as the validator and the API server print it."""
        base = "" if self.scope == "root" else "spec"
        return ".".join(p for p in (base, self.field) if p)

    def to_validation(self) -> dict[str, str]:
        """The CRD's ``x-kubernetes-validations`` item."""
        out = {"rule": self.rule, **self.message.to_validation()}
        if self.field:
            out["fieldPath"] = f".{self.field}"
        return out


def _str_lit(text: str) -> str:
    """A CEL double-quoted string literal."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def first_entry(values: Mapping[str, object]) -> str:
    """``key='value'`` of the first offending entry in key order (see :func:`_cel_first_entry`)."""
    key = min(values)
    return f"{key}='{values[key]}'"


def first_key(keys: Iterable[str]) -> str:
    """The first offending key in key order (see :func:`_cel_first_key`)."""
    return min(keys)


# Only the first offender is named: the API server's cost estimator refuses ``join()`` on
# map keys (their length is unbounded) but accepts ``sort()[0]``.
def _cel_first_entry(expr: str, keep: str) -> str:
    """CEL for :func:`first_entry` over the keys ``k`` of map ``expr`` that pass ``keep``."""
    return f'{expr}.filter(k, {keep}).sort().map(k, k + "=\'" + string({expr}[k]) + "\'")[0]'


def _cel_first_key(expr: str, keep: str) -> str:
    """CEL for :func:`first_key` over the keys ``k`` of map ``expr`` that pass ``keep``."""
    return f"{expr}.filter(k, {keep}).sort()[0]"


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


def gpu_typo_pattern(name: str) -> str:
    """A regular expression (unanchored, to match case-insensitively) of the names within
    one edit of ``name``: one character replaced, dropped, added, or two adjacent swapped.

    It also matches ``name`` itself (a character "replaced" by itself): the checks exclude
    the recognised names explicitly.
    """
    parts: list[str] = []
    for i in range(len(name) + 1):
        head, rest = re.escape(name[:i]), name[i:]
        parts.append(f"{head}.{re.escape(rest)}")  # one added
        if rest:
            parts.append(f"{head}.{re.escape(rest[1:])}")  # one replaced
            parts.append(f"{head}{re.escape(rest[1:])}")  # one dropped
        if len(rest) > 1:
            parts.append(f"{head}{re.escape(rest[1] + rest[0] + rest[2:])}")  # two swapped
    return "|".join(dict.fromkeys(parts))


def _is_gpu_typo(key: str, name: str) -> str:
    known = ", ".join(f"'{n}'" for n in model.GPU_RESOURCES)
    return f"(!({key} in [{known}]) && {key}.matches({_lit(f'(?i)^({gpu_typo_pattern(name)})$')}))"


def integer_value(value: str) -> bool:
    """Whether ``value`` is a Gt/Lt value (see :data:`INTEGER_PATTERN`)."""
    return re.fullmatch(INTEGER_PATTERN[1:-1], value) is not None


def label_requirement_ok(operator: object, values: list[object] | None) -> bool:
    """Whether a ``matchExpressions`` requirement's values fit its operator (Kubernetes' rule)."""
    if operator in ("In", "NotIn"):
        return bool(values)
    if operator in ("Exists", "DoesNotExist"):
        return not values
    return values is not None and len(values) == 1 and integer_value(str(values[0]))


def field_requirement_ok(key: object, operator: object, values: list[object] | None) -> bool:
    """Whether a ``matchFields`` requirement is one Kubernetes supports: ``metadata.name``,
    ``In`` or ``NotIn``, exactly one value."""
    return (
        key == "metadata.name"
        and operator in ("In", "NotIn")
        and values is not None
        and len(values) == 1
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
    """(has-guard, expression, field relative to spec) of the three resource maps."""
    return [
        (_HAS_RR, _RR, "resourceRequests"),
        (_HAS_REQ, _REQ, "template.resources.requests"),
        (_HAS_LIM, _LIM, "template.resources.limits"),
    ]


def _label_maps() -> list[tuple[str, str, str]]:
    """(has-guard, expression, field relative to spec) of the maps with reserved keys."""
    return [
        ("has(self.annotations)", "self.annotations", "annotations"),
        (
            "has(self.template) && has(self.template.annotations)",
            "self.template.annotations",
            "template.annotations",
        ),
        (
            "has(self.template) && has(self.template.labels)",
            "self.template.labels",
            "template.labels",
        ),
    ]


# --- messages (the validator formats the same objects) --------------------------------

POOL_NAME_TOO_LONG = Message("must be at most 63 characters: it is the worker-pool label value")
SANDBOX_CLASS_UNKNOWN = Message("must be 'gvisor' or 'microvm'")
SHARING_STRATEGY_UNKNOWN = Message("must be 'exclusive' or 'mps'")
WORKERS_MISSING = Message("is required (or replicas): the number of worker pods")
AT_LEAST_ONE = Message("must be at least 1")
NOT_NEGATIVE = Message("must not be negative")
ACTORS_RANGE = Message("must be between 1 and 4094")
MPS_CLIENTS_MISSING = Message("is required with strategy mps: how many workers share one GPU")
MPS_CLIENTS_WITHOUT_MPS = Message(
    "is only meaningful with strategy mps (exclusive gives each worker its GPUs)"
)
MPS_CLIENTS_RANGE = Message("must be between 2 and 48 (NVIDIA MPS's client limit)")
MPS_ONE_GPU = Message(
    "mps shares exactly 1 nvidia.com/gpu per worker: the NVIDIA device plugin refuses more "
    "than one shared GPU per container"
)
SHARING_WITHOUT_GPU = Message(
    "is set but the pool requests no nvidia.com/gpu: remove it, or request a GPU"
)


IMAGE_BOTH_NAMES = Message("is the deprecated name of workerImage: set workerImage only, not both")
NODE_WEIGHT = Message("the weight of every preferred term must be between 1 and 100")
NODE_LABEL_REQUIREMENT = Message(
    "each matchExpressions requirement must fit its operator: In and NotIn need values, "
    "Exists and DoesNotExist none, Gt and Lt exactly one whole number"
)
NODE_FIELD_REQUIREMENT = Message(
    "each matchFields requirement must be on metadata.name, with operator In or NotIn "
    "and exactly one value (all Kubernetes supports)"
)


def conflict_message(flat: str, upstream: str) -> Message:
    """A flat field written together with its upstream counterpart."""
    return Message(f"set either {flat} (flat form) or {upstream} (upstream form), not both")


def gpu_support_message(resource: str) -> Message:
    """``resource`` on a sandbox class that does not support it."""
    return Message(model.gpu_support_message(resource))


def _resource_count(expr: str) -> Message:
    return Message(
        "extended resources such as nvidia.com/gpu must be positive whole numbers, not {found}",
        {"found": _cel_first_entry(expr, f"{_is_extended('k')} && !{_count_ok(f'{expr}[k]')}")},
    )


def _resource_quantity(expr: str) -> Message:
    return Message(
        "values must be Kubernetes quantities such as 500m, 2 or 4Gi, not {found}",
        {
            "found": _cel_first_entry(
                expr,
                f"!{_is_extended('k')} && !string({expr}[k]).matches({_lit(QUANTITY_PATTERN)})",
            )
        },
    )


RESOURCE_COUNT = {where: _resource_count(expr) for _, expr, where in _resource_maps()}
"""Per resource map (field relative to spec): extended resources that are not counts."""
RESOURCE_QUANTITY = {where: _resource_quantity(expr) for _, expr, where in _resource_maps()}
"""Per resource map (field relative to spec): native resources that are not quantities."""

_LIMIT_MISSING = (
    f"{_is_extended('k')} && !(({_HAS_LIM}) && k in {_LIM} "
    f"&& string({_LIM}[k]) == string({_REQ}[k]))"
)
EXTENDED_LIMIT = Message(
    "must equal the request of each extended resource (Kubernetes admits a request for one "
    "only with an equal limit): requested {found}",
    {"found": _cel_first_entry(_REQ, _LIMIT_MISSING)},
)

GPU_TYPO = {
    (where, name): Message(
        "{found} is not " + name + ", one edit away: did you mean " + name + "? (a misspelt "
        "GPU resource gets the workers no GPU)",
        {"found": _cel_first_key(expr, _is_gpu_typo("k", name))},
    )
    for _, expr, where in _resource_maps()
    for name in model.GPU_RESOURCES
}
"""Per resource map (field relative to spec) and recognised GPU resource: a key one edit
(or a letter case) from that resource's name, which Kubernetes would take as another
extended resource: a pool whose workers never get a GPU."""

RESERVED_KEYS = {
    where: Message(
        "keys in the ate.dev and substrate.io domains are reserved for the controller: {keys}",
        {"keys": _cel_first_key(expr, _reserved("k"))},
    )
    for _, expr, where in _label_maps()
}
"""Per label or annotation map (field relative to spec): keys in the reserved domains."""

_GPU = _gpu_value()
_SLOTS_PER_GPU = f"({_STRATEGY} == 'mps' ? {_CLIENTS} : 1)"
GPU_OVERSUBSCRIBED = Message(
    "{workers} workers x {gpus} GPU need {needed} GPU slots but gpuCapacity provides "
    "{slots} ({strategy}): lower {field}, or share GPUs with strategy mps",
    {
        "workers": _WORKERS,
        "gpus": _GPU,
        "needed": f"{_WORKERS} * int(string({_GPU}))",
        "slots": f"{_SHARING}.gpuCapacity * {_SLOTS_PER_GPU}",
        "strategy": _STRATEGY,
        "field": "(has(self.maxWorkers) ? 'maxWorkers' : 'replicas')",
    },
)


# --- the rules ---------------------------------------------------------------------------


def _build_rules() -> tuple[CelRule, ...]:
    rules: list[CelRule] = [
        CelRule(
            Code.POOL_NAME,
            "root",
            "!has(self.metadata.name) || self.metadata.name.size() <= 63",
            POOL_NAME_TOO_LONG,
            "metadata.name",
        ),
        CelRule(
            Code.SANDBOX_CLASS,
            "spec",
            "!has(self.sandboxClass) || self.sandboxClass in ['gvisor', 'microvm']",
            SANDBOX_CLASS_UNKNOWN,
            "sandboxClass",
        ),
        CelRule(
            Code.SHARING_STRATEGY,
            "spec",
            f"!has({_SHARING}) || !has({_SHARING}.strategy) "
            f"|| {_SHARING}.strategy in ['exclusive', 'mps']",
            SHARING_STRATEGY_UNKNOWN,
            "gpuSharing.strategy",
        ),
        CelRule(
            Code.WORKERS_REQUIRED,
            "spec",
            "has(self.maxWorkers) || has(self.replicas)",
            WORKERS_MISSING,
            "maxWorkers",
        ),
        CelRule(
            Code.WORKER_COUNT,
            "spec",
            "!has(self.maxWorkers) || self.maxWorkers >= 1",
            AT_LEAST_ONE,
            "maxWorkers",
        ),
        CelRule(
            Code.WORKER_COUNT,
            "spec",
            "!has(self.replicas) || self.replicas >= 0",
            NOT_NEGATIVE,
            "replicas",
        ),
        CelRule(
            Code.WORKER_COUNT,
            "spec",
            "!has(self.maxActorsPerWorker) "
            "|| (self.maxActorsPerWorker >= 1 && self.maxActorsPerWorker <= 4094)",
            ACTORS_RANGE,
            "maxActorsPerWorker",
        ),
        CelRule(
            Code.WORKER_COUNT,
            "spec",
            f"!has({_SHARING}) || !has({_SHARING}.gpuCapacity) || {_SHARING}.gpuCapacity >= 1",
            AT_LEAST_ONE,
            "gpuSharing.gpuCapacity",
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
                conflict_message(flat, upstream),
                flat,
            )
        )
    for has_map, expr, where in _resource_maps():
        rules.append(
            CelRule(
                Code.RESOURCE_COUNT,
                "spec",
                f"!({has_map}) || {expr}.all(k, !{_is_extended('k')} || {_count_ok(f'{expr}[k]')})",
                RESOURCE_COUNT[where],
                where,
            )
        )
        rules.append(
            CelRule(
                Code.RESOURCE_QUANTITY,
                "spec",
                f"!({has_map}) || {expr}.all(k, {_is_extended('k')} "
                f"|| string({expr}[k]).matches({_lit(QUANTITY_PATTERN)}))",
                RESOURCE_QUANTITY[where],
                where,
            )
        )
    rules.append(
        CelRule(
            Code.EXTENDED_LIMIT,
            "spec",
            f"!({_HAS_REQ}) || {_REQ}.all(k, !({_LIMIT_MISSING}))",
            EXTENDED_LIMIT,
            "template.resources.limits",
        )
    )
    # One rule per GPU resource and map, so each reports the map it was written in.
    for has_map, expr, where in _resource_maps():
        for resource, support in model.GPU_RESOURCES.items():
            classes = ", ".join(f"'{c}'" for c in sorted(support.sandbox_classes))
            written = f"({has_map} && {_lit(resource)} in {expr})"
            supported = f" || {_CLASS} in [{classes}]" if classes else ""
            rules.append(
                CelRule(
                    Code.GPU_SANDBOX_CLASS,
                    "spec",
                    f"!{written}{supported}",
                    gpu_support_message(resource),
                    where,
                )
            )
    for (where, name), message in GPU_TYPO.items():
        has_map, expr = next((h, e) for h, e, w in _resource_maps() if w == where)
        rules.append(
            CelRule(
                Code.GPU_RESOURCE_TYPO,
                "spec",
                f"!({has_map}) || {expr}.all(k, !{_is_gpu_typo('k', name)})",
                message,
                where,
            )
        )
    rules.append(
        CelRule(
            Code.CONFLICTING_FIELDS,
            "spec",
            "!(has(self.ateomImage) && has(self.workerImage))",
            IMAGE_BOTH_NAMES,
            "ateomImage",
        )
    )
    rules += _node_affinity_rules()
    has_gpu = _has_resource(model.GPU_RESOURCE)
    rules += [
        CelRule(
            Code.MPS_CLIENTS_REQUIRED,
            "spec",
            f"!has({_SHARING}) || {_STRATEGY} != 'mps' || has({_CLIENTS})",
            MPS_CLIENTS_MISSING,
            "gpuSharing.clientsPerGpu",
        ),
        CelRule(
            Code.MPS_CLIENTS_UNEXPECTED,
            "spec",
            f"!has({_SHARING}) || !has({_CLIENTS}) || {_STRATEGY} == 'mps'",
            MPS_CLIENTS_WITHOUT_MPS,
            "gpuSharing.clientsPerGpu",
        ),
        CelRule(
            Code.MPS_CLIENTS_RANGE,
            "spec",
            f"!has({_SHARING}) || !has({_CLIENTS}) || ({_CLIENTS} >= 2 && {_CLIENTS} <= 48)",
            MPS_CLIENTS_RANGE,
            "gpuSharing.clientsPerGpu",
        ),
        CelRule(
            Code.MPS_SINGLE_GPU,
            "spec",
            f"!has({_SHARING}) || {_STRATEGY} != 'mps' || !{has_gpu} || string({_GPU}) == '1'",
            MPS_ONE_GPU,
            "gpuSharing.strategy",
        ),
        CelRule(
            Code.SHARING_WITHOUT_GPU,
            "spec",
            f"!has({_SHARING}) || {has_gpu}",
            SHARING_WITHOUT_GPU,
            "gpuSharing",
        ),
        CelRule(
            Code.GPU_OVERSUBSCRIBED,
            "spec",
            f"!has({_SHARING}) || !has({_SHARING}.gpuCapacity) || !{has_gpu} "
            f"|| !{_count_ok(_GPU)} || !(has(self.maxWorkers) || has(self.replicas)) "
            f"|| !({_STRATEGY} == 'exclusive' || ({_STRATEGY} == 'mps' && has({_CLIENTS}))) "
            f"|| {_WORKERS} * int(string({_GPU})) <= {_SHARING}.gpuCapacity * {_SLOTS_PER_GPU}",
            GPU_OVERSUBSCRIBED,
            "gpuSharing.gpuCapacity",
        ),
    ]
    for has_map, expr, where in _label_maps():
        rules.append(
            CelRule(
                Code.RESERVED_KEY,
                "spec",
                f"!({has_map}) || {expr}.all(k, !{_reserved('k')})",
                RESERVED_KEYS[where],
                where,
            )
        )
    return tuple(rules)


def _node_affinity_rules() -> list[CelRule]:
    affinity = "self.template.nodeAffinity"
    has_affinity = f"has(self.template) && has({affinity})"
    required = f"{affinity}.requiredDuringSchedulingIgnoredDuringExecution"
    preferred = f"{affinity}.preferredDuringSchedulingIgnoredDuringExecution"
    values = "(has(r.values) ? size(r.values) : 0)"
    label_ok = (
        f"(r.operator in ['In', 'NotIn'] && {values} >= 1) "
        f"|| (r.operator in ['Exists', 'DoesNotExist'] && {values} == 0) "
        f"|| (r.operator in ['Gt', 'Lt'] && {values} == 1 "
        f"&& r.values[0].matches({_lit(INTEGER_PATTERN)}))"
    )
    field_ok = f"r.key == 'metadata.name' && r.operator in ['In', 'NotIn'] && {values} == 1"

    def every_requirement(kind: str, ok: str) -> str:
        """``ok`` (on ``r``) holds for every ``kind`` requirement of every term."""

        def term(t: str) -> str:
            return f"(!has({t}.{kind}) || {t}.{kind}.all(r, {ok}))"

        return (
            f"!({has_affinity}) || ((!has({required}) || "
            f"{required}.nodeSelectorTerms.all(t, {term('t')})) && (!has({preferred}) || "
            f"{preferred}.all(p, {term('p.preference')})))"
        )

    return [
        CelRule(
            Code.NODE_AFFINITY,
            "spec",
            f"!({has_affinity}) || !has({preferred}) "
            f"|| {preferred}.all(p, p.weight >= 1 && p.weight <= 100)",
            NODE_WEIGHT,
            "template.nodeAffinity",
        ),
        CelRule(
            Code.NODE_AFFINITY,
            "spec",
            every_requirement("matchExpressions", label_ok),
            NODE_LABEL_REQUIREMENT,
            "template.nodeAffinity",
        ),
        CelRule(
            Code.NODE_AFFINITY,
            "spec",
            every_requirement("matchFields", field_ok),
            NODE_FIELD_REQUIREMENT,
            "template.nodeAffinity",
        ),
    ]


RULES: tuple[CelRule, ...] = _build_rules()
"""Every CEL rule of the WorkerPool CRD."""
