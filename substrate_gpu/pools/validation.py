"""Validate a WorkerPool document: every problem in one pass, each with its field path.

Two layers, in one walk:

1. **Structure** (types, unknown fields, required fields) against :data:`.schema.SPEC`,
   the same tree the CRD's ``openAPIV3Schema`` is generated from.
2. **Semantics**, written here by hand and mirrored in CEL by :mod:`.rules`: GPU support
   per sandbox class, limits equal to requests for extended resources, positive counts,
   GPU oversubscription, MPS consistency, reserved keys. A semantic check only looks at
   fields that are well typed, as the API server only runs CEL on schema-valid objects.
   Its problem is worded by the CEL rule's own :class:`~.rules.Message`, on the rule's
   field, so ``pool validate`` and the API server say the same thing.

Warnings (never blocking, Python only): a GPU pool whose worker image looks distroless,
where ``nvidia-ctk`` (a glibc binary) cannot run; ``ateomImage``, the deprecated name of
``workerImage``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from typing import cast

from substrate_gpu.pools import model, rules, schema
from substrate_gpu.pools.problems import (
    Code,
    PoolValidationError,
    Problem,
    ValidationReport,
)

__all__ = ["field_path", "load_pool", "validate_document"]

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_COUNT = re.compile(rules.COUNT_PATTERN.strip("^$"))
_QUANTITY = re.compile(rules.QUANTITY_PATTERN[1:-1])
_DISTROLESS = re.compile(r"(^|[/.-])distroless([/:@.-]|$)|(^|/)chainguard/static([:@]|$)")

PathPart = str | int


def field_path(parts: Sequence[PathPart]) -> str:
    """Render a path: ``spec.template.resources.limits["nvidia.com/gpu"]``, ``tolerations[0]``."""
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        elif _IDENTIFIER.fullmatch(part):
            out += f".{part}" if out else part
        else:
            out += f'["{part}"]'
    return out


class _Collector:
    def __init__(self) -> None:
        self.errors: list[Problem] = []
        self.warnings: list[Problem] = []

    def error(
        self,
        path: Sequence[PathPart],
        code: Code,
        message: str | rules.Message,
        **values: object,
    ) -> None:
        """Record an error; a :class:`~.rules.Message` is the CEL rule's own text, filled in."""
        text = message.format(**values) if isinstance(message, rules.Message) else message
        self.errors.append(Problem(field_path(path), text, code))

    def warn(self, path: Sequence[PathPart], code: Code, message: str) -> None:
        self.warnings.append(Problem(field_path(path), message, code))


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _type_name(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, Mapping):
        return "object"
    if isinstance(value, list):
        return "list"
    return type(value).__name__


# --- structure ------------------------------------------------------------------------


def _check_structure(
    value: object, shape: schema.SchemaField, path: list[PathPart], out: _Collector
) -> bool:
    """Report type problems under ``path``; True when ``value`` is fully well typed."""
    if isinstance(shape, schema.StringField):
        if not isinstance(value, str):
            out.error(path, Code.TYPE, f"must be a string, not {_type_name(value)}")
            return False
        ok = True
        if shape.enum and value not in shape.enum:
            out.error(path, Code.TYPE, f"must be one of {', '.join(shape.enum)}")
            ok = False
        if len(value) < shape.min_length:
            out.error(path, Code.TYPE, "must not be empty")
            ok = False
        if shape.max_length is not None and len(value) > shape.max_length:
            out.error(path, Code.TYPE, f"must be at most {shape.max_length} characters")
            ok = False
        return ok
    if isinstance(shape, schema.IntField):
        if not _is_int(value):
            out.error(path, Code.TYPE, f"must be an integer, not {_type_name(value)}")
            return False
        if not -schema.INT32_MAX - 1 <= cast("int", value) <= schema.INT32_MAX:
            out.error(path, Code.TYPE, "must fit in a 32-bit integer")
            return False
        return True
    if isinstance(shape, schema.IntOrStringField):
        if not (_is_int(value) or isinstance(value, str)):
            out.error(path, Code.TYPE, f"must be an integer or a string, not {_type_name(value)}")
            return False
        if isinstance(value, str) and len(value) > shape.max_length:
            out.error(path, Code.TYPE, f"must be at most {shape.max_length} characters")
            return False
        return True
    if isinstance(shape, schema.MapField):
        if not isinstance(value, Mapping):
            out.error(path, Code.TYPE, f"must be a map, not {_type_name(value)}")
            return False
        ok = True
        if len(value) > shape.max_properties:
            out.error(path, Code.TYPE, f"must have at most {shape.max_properties} entries")
            ok = False
        for key, item in value.items():
            if not isinstance(key, str):
                out.error([*path, str(key)], Code.TYPE, "keys must be strings")
                ok = False
                continue
            ok = _check_structure(item, shape.values, [*path, key], out) and ok
        return ok
    if isinstance(shape, schema.ListField):
        if not isinstance(value, list):
            out.error(path, Code.TYPE, f"must be a list, not {_type_name(value)}")
            return False
        ok = True
        if len(value) > shape.max_items:
            out.error(path, Code.TYPE, f"must have at most {shape.max_items} items")
            ok = False
        if len(value) < shape.min_items:
            out.error(path, Code.TYPE, f"must have at least {shape.min_items} item(s)")
            ok = False
        for index, item in enumerate(value):
            ok = _check_structure(item, shape.items, [*path, index], out) and ok
        return ok
    if not isinstance(value, Mapping):
        out.error(path, Code.TYPE, f"must be an object, not {_type_name(value)}")
        return False
    ok = True
    for name in shape.required:
        if name not in value:
            out.error([*path, name], Code.REQUIRED, "is required")
            ok = False
    for key, item in value.items():
        sub = shape.properties.get(key) if isinstance(key, str) else None
        if sub is None:
            out.error([*path, str(key)], Code.UNKNOWN_FIELD, _unknown_field(key, shape))
            ok = False
            continue
        ok = _check_structure(item, sub, [*path, key], out) and ok
    return ok


def _unknown_field(key: object, shape: schema.ObjectField) -> str:
    """``unknown field``, the nearest known one when there is one, and all of them."""
    known = ", ".join(shape.properties)
    import difflib  # noqa: PLC0415  (only for a misspelt field: the CLI starts without it)

    nearest = difflib.get_close_matches(str(key), shape.properties, n=1, cutoff=0.6)
    hint = f": did you mean {nearest[0]}?" if nearest else ""
    return f"unknown field{hint} (known: {known})"


def _well_typed_spec(spec: Mapping[str, object], out: _Collector) -> dict[str, object]:
    """Check spec's structure; keep only the fields that are fully well typed."""
    kept: dict[str, object] = {}
    for key, item in spec.items():
        sub = schema.SPEC.properties.get(key) if isinstance(key, str) else None
        if sub is None:
            out.error(["spec", str(key)], Code.UNKNOWN_FIELD, _unknown_field(key, schema.SPEC))
        elif _check_structure(item, sub, ["spec", key], out):
            kept[key] = item
    return kept


# --- semantics ------------------------------------------------------------------------


def _m(raw: object) -> Mapping[str, object]:
    return cast("Mapping[str, object]", raw) if isinstance(raw, Mapping) else {}


def _count_ok(value: object) -> bool:
    return (_is_int(value) or isinstance(value, str)) and _COUNT.fullmatch(str(value)) is not None


def _resource_maps(
    spec: Mapping[str, object],
) -> Iterator[tuple[list[PathPart], Mapping[str, object]]]:
    if "resourceRequests" in spec:
        yield ["spec", "resourceRequests"], _m(spec["resourceRequests"])
    resources = _m(_m(spec.get("template")).get("resources"))
    for kind in ("requests", "limits"):
        if kind in resources:
            yield ["spec", "template", "resources", kind], _m(resources[kind])


def _gpu_value(spec: Mapping[str, object]) -> tuple[list[PathPart], object] | None:
    """Where the per-worker NVIDIA GPU count is written, and its value (limits first)."""
    found = {
        tuple(path): m[model.GPU_RESOURCE]
        for path, m in _resource_maps(spec)
        if model.GPU_RESOURCE in m
    }
    for kind in (
        ("spec", "template", "resources", "limits"),
        ("spec", "template", "resources", "requests"),
        ("spec", "resourceRequests"),
    ):
        if kind in found:
            return [*kind, model.GPU_RESOURCE], found[kind]
    return None


def _check_counts(spec: Mapping[str, object], out: _Collector, *, written: frozenset[str]) -> None:
    if "maxWorkers" in spec and cast("int", spec["maxWorkers"]) < 1:
        out.error(["spec", "maxWorkers"], Code.WORKER_COUNT, rules.AT_LEAST_ONE)
    if "replicas" in spec and cast("int", spec["replicas"]) < 0:
        out.error(["spec", "replicas"], Code.WORKER_COUNT, rules.NOT_NEGATIVE)
    if "maxActorsPerWorker" in spec and not 1 <= cast("int", spec["maxActorsPerWorker"]) <= 4094:
        out.error(["spec", "maxActorsPerWorker"], Code.WORKER_COUNT, rules.ACTORS_RANGE)
    sharing = _m(spec.get("gpuSharing"))
    if "gpuCapacity" in sharing and cast("int", sharing["gpuCapacity"]) < 1:
        out.error(["spec", "gpuSharing", "gpuCapacity"], Code.WORKER_COUNT, rules.AT_LEAST_ONE)
    # Presence, not validity: an ill-typed maxWorkers is a type error, not a missing one.
    if "maxWorkers" not in written and "replicas" not in written:
        out.error(["spec", "maxWorkers"], Code.WORKERS_REQUIRED, rules.WORKERS_MISSING)


def _check_conflicts(spec: Mapping[str, object], out: _Collector) -> None:
    template = _m(spec.get("template"))
    for flat, upstream, present in [
        ("maxWorkers", ("replicas",), "replicas" in spec),
        ("resourceRequests", ("template", "resources"), "resources" in template),
        ("nodeSelector", ("template", "nodeSelector"), "nodeSelector" in template),
        ("annotations", ("template", "annotations"), "annotations" in template),
    ]:
        if flat in spec and present:
            out.error(
                ["spec", flat],
                Code.CONFLICTING_FIELDS,
                rules.conflict_message(flat, ".".join(upstream)),
            )


def _check_resources(spec: Mapping[str, object], out: _Collector) -> None:
    for path, values in _resource_maps(spec):
        field = field_path(path[1:])
        not_counts = {
            name: value
            for name, value in values.items()
            if model.is_extended_resource(name) and not _count_ok(value)
        }
        if not_counts:
            found = rules.first_entry(not_counts)
            out.error(path, Code.RESOURCE_COUNT, rules.RESOURCE_COUNT[field], found=found)
        not_quantities = {
            name: value
            for name, value in values.items()
            if not model.is_extended_resource(name) and _QUANTITY.fullmatch(str(value)) is None
        }
        if not_quantities:
            found = rules.first_entry(not_quantities)
            out.error(path, Code.RESOURCE_QUANTITY, rules.RESOURCE_QUANTITY[field], found=found)
        for resource in model.GPU_RESOURCES:
            if resource in values and _sandbox_class(spec) not in _supporting(resource):
                out.error(path, Code.GPU_SANDBOX_CLASS, rules.gpu_support_message(resource))
            typos = [name for name in values if _is_gpu_typo(name, resource)]
            if typos:
                out.error(
                    path,
                    Code.GPU_RESOURCE_TYPO,
                    rules.GPU_TYPO[field, resource],
                    found=rules.first_key(typos),
                )
    resources = _m(_m(spec.get("template")).get("resources"))
    if "requests" in resources:
        limits = _m(resources.get("limits"))
        unmatched = {
            name: value
            for name, value in _m(resources["requests"]).items()
            if model.is_extended_resource(name)
            and (name not in limits or str(limits[name]) != str(value))
        }
        if unmatched:
            out.error(
                ["spec", "template", "resources", "limits"],
                Code.EXTENDED_LIMIT,
                rules.EXTENDED_LIMIT,
                found=rules.first_entry(unmatched),
            )


_TYPO_PATTERNS = {
    name: re.compile(rules.gpu_typo_pattern(name), re.IGNORECASE) for name in model.GPU_RESOURCES
}


def _is_gpu_typo(key: str, resource: str) -> bool:
    """Whether ``key`` is one edit (or a letter case) from ``resource`` without being a
    recognised GPU resource itself."""
    return key not in model.GPU_RESOURCES and _TYPO_PATTERNS[resource].fullmatch(key) is not None


def _sandbox_class(spec: Mapping[str, object]) -> object:
    return spec.get("sandboxClass", model.DEFAULT_SANDBOX_CLASS)


def _supporting(resource: str) -> frozenset[str]:
    return model.GPU_RESOURCES[resource].sandbox_classes


def _check_sandbox_class(spec: Mapping[str, object], out: _Collector) -> None:
    if _sandbox_class(spec) not in ("gvisor", "microvm"):
        out.error(["spec", "sandboxClass"], Code.SANDBOX_CLASS, rules.SANDBOX_CLASS_UNKNOWN)


def _check_sharing(spec: Mapping[str, object], out: _Collector) -> None:
    if "gpuSharing" not in spec:
        return
    sharing = _m(spec["gpuSharing"])
    base: list[PathPart] = ["spec", "gpuSharing"]
    strategy = sharing.get("strategy", "exclusive")
    clients = sharing.get("clientsPerGpu")
    if strategy not in ("exclusive", "mps"):
        out.error([*base, "strategy"], Code.SHARING_STRATEGY, rules.SHARING_STRATEGY_UNKNOWN)
    if strategy == "mps" and clients is None:
        out.error([*base, "clientsPerGpu"], Code.MPS_CLIENTS_REQUIRED, rules.MPS_CLIENTS_MISSING)
    if clients is not None:
        if strategy != "mps":
            out.error(
                [*base, "clientsPerGpu"], Code.MPS_CLIENTS_UNEXPECTED, rules.MPS_CLIENTS_WITHOUT_MPS
            )
        if not 2 <= cast("int", clients) <= 48:
            out.error([*base, "clientsPerGpu"], Code.MPS_CLIENTS_RANGE, rules.MPS_CLIENTS_RANGE)
    gpu = _gpu_value(spec)
    if gpu is None:
        out.error(base, Code.SHARING_WITHOUT_GPU, rules.SHARING_WITHOUT_GPU)
        return
    gpu_value = gpu[1]
    if strategy == "mps" and str(gpu_value) != "1":
        out.error([*base, "strategy"], Code.MPS_SINGLE_GPU, rules.MPS_ONE_GPU)
    capacity = sharing.get("gpuCapacity")
    workers = spec.get("maxWorkers", spec.get("replicas"))
    if capacity is None or workers is None or not _count_ok(gpu_value):
        return
    if strategy == "exclusive":
        slots = cast("int", capacity)
    elif strategy == "mps" and clients is not None:
        slots = cast("int", capacity) * cast("int", clients)
    else:
        return
    needed = cast("int", workers) * int(str(gpu_value))
    if needed > slots:
        out.error(
            [*base, "gpuCapacity"],
            Code.GPU_OVERSUBSCRIBED,
            rules.GPU_OVERSUBSCRIBED,
            workers=workers,
            gpus=gpu_value,
            needed=needed,
            slots=slots,
            strategy=strategy,
            field="maxWorkers" if "maxWorkers" in spec else "replicas",
        )


def _check_reserved_keys(spec: Mapping[str, object], out: _Collector) -> None:
    template = _m(spec.get("template"))
    for path, values in [
        (["spec", "annotations"], _m(spec.get("annotations"))),
        (["spec", "template", "annotations"], _m(template.get("annotations"))),
        (["spec", "template", "labels"], _m(template.get("labels"))),
    ]:
        reserved = [
            key
            for key in values
            if any(key.startswith(f"{d}/") or f".{d}/" in key for d in rules.RESERVED_DOMAINS)
        ]
        if reserved:
            out.error(
                path,
                Code.RESERVED_KEY,
                rules.RESERVED_KEYS[field_path(path[1:])],
                keys=rules.first_key(reserved),
            )


#: Kubernetes' limit on an object's annotations, keys and values together
#: (``TotalAnnotationSizeLimitB`` in apimachinery's ValidateAnnotationsSize).
ANNOTATIONS_MAX_BYTES = 256 * 1024


def _check_annotation_size(
    metadata: Mapping[str, object], spec: Mapping[str, object], out: _Collector
) -> None:
    # The pool's own, and the two maps the controller copies onto the worker pod.
    for path, values in [
        (["metadata", "annotations"], _m(metadata.get("annotations"))),
        (["spec", "annotations"], _m(spec.get("annotations"))),
        (["spec", "template", "annotations"], _m(_m(spec.get("template")).get("annotations"))),
    ]:
        size = sum(
            len(key.encode()) + len(value.encode())
            for key, value in values.items()
            if isinstance(key, str) and isinstance(value, str)
        )
        if size > ANNOTATIONS_MAX_BYTES:
            out.error(
                path,
                Code.ANNOTATIONS_TOO_LONG,
                f"must be at most {ANNOTATIONS_MAX_BYTES} bytes in total, keys and values"
                f" (Kubernetes refuses larger annotations on any object); these are {size}",
            )


def _check_image(spec: Mapping[str, object], out: _Collector) -> None:
    if "ateomImage" in spec:
        if "workerImage" in spec:
            out.error(["spec", "ateomImage"], Code.CONFLICTING_FIELDS, rules.IMAGE_BOTH_NAMES)
        else:
            out.warn(
                ["spec", "ateomImage"],
                Code.DEPRECATED_FIELD,
                "is deprecated: upstream renamed it workerImage, which means the same; "
                "write workerImage",
            )
    field = "workerImage" if "workerImage" in spec else "ateomImage"
    image = spec.get(field)
    if isinstance(image, str) and _gpu_value(spec) is not None and _DISTROLESS.search(image):
        out.warn(
            ["spec", field],
            Code.DISTROLESS_IMAGE,
            f"{image} looks distroless: GPU workers run nvidia-ctk, a glibc binary that "
            "cannot execute without a C library; use a glibc-based image",
        )


def _terms(affinity: Mapping[str, object]) -> Iterator[Mapping[str, object]]:
    """Every node selector term of a node affinity: the required ones, then the preferred."""
    required = _m(affinity.get("requiredDuringSchedulingIgnoredDuringExecution"))
    for term in cast("list[object]", required.get("nodeSelectorTerms", [])):
        yield _m(term)
    for preferred in cast("list[object]", affinity.get(_PREFERRED, [])):
        yield _m(_m(preferred).get("preference"))


_PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"


def _check_node_affinity(spec: Mapping[str, object], out: _Collector) -> None:
    template = _m(spec.get("template"))
    if "nodeAffinity" not in template:
        return
    affinity = _m(template["nodeAffinity"])
    path: list[PathPart] = ["spec", "template", "nodeAffinity"]
    weights = [_m(p).get("weight") for p in cast("list[object]", affinity.get(_PREFERRED, []))]
    if any(not 1 <= cast("int", w) <= 100 for w in weights):
        out.error(path, Code.NODE_AFFINITY, rules.NODE_WEIGHT)

    def requirements(kind: str) -> Iterator[Mapping[str, object]]:
        for term in _terms(affinity):
            for item in cast("list[object]", term.get(kind, [])):
                yield _m(item)

    if not all(
        rules.label_requirement_ok(r.get("operator"), _opt_list(r.get("values")))
        for r in requirements("matchExpressions")
    ):
        out.error(path, Code.NODE_AFFINITY, rules.NODE_LABEL_REQUIREMENT)
    if not all(
        rules.field_requirement_ok(r.get("key"), r.get("operator"), _opt_list(r.get("values")))
        for r in requirements("matchFields")
    ):
        out.error(path, Code.NODE_AFFINITY, rules.NODE_FIELD_REQUIREMENT)


def _opt_list(raw: object) -> list[object] | None:
    return cast("list[object]", raw) if isinstance(raw, list) else None


# --- entry points ---------------------------------------------------------------------


def validate_document(doc: object) -> ValidationReport:
    """Validate one parsed WorkerPool document; never raises on bad input."""
    out = _Collector()
    if not isinstance(doc, Mapping):
        out.error([], Code.TYPE, f"a WorkerPool must be a YAML mapping, not {_type_name(doc)}")
        return ValidationReport(tuple(out.errors))
    if doc.get("apiVersion") != model.API_VERSION:
        out.error(["apiVersion"], Code.TYPE, f"must be {model.API_VERSION}")
    if doc.get("kind") != model.KIND:
        out.error(["kind"], Code.TYPE, f"must be {model.KIND}")
    metadata = doc.get("metadata")
    if not isinstance(metadata, Mapping):
        out.error(["metadata"], Code.REQUIRED, "is required and must be a mapping with a name")
    else:
        name = metadata.get("name")
        if not isinstance(name, str) or not name:
            out.error(["metadata", "name"], Code.REQUIRED, "is required")
        elif len(name) > 63:
            out.error(["metadata", "name"], Code.POOL_NAME, rules.POOL_NAME_TOO_LONG)
        namespace = metadata.get("namespace")
        if namespace is not None and not isinstance(namespace, str):
            out.error(["metadata", "namespace"], Code.TYPE, "must be a string")
    raw_spec = doc.get("spec")
    if not isinstance(raw_spec, Mapping):
        out.error(["spec"], Code.REQUIRED, "is required and must be a mapping")
        return ValidationReport(tuple(out.errors), tuple(out.warnings))
    spec = _well_typed_spec(cast("Mapping[str, object]", raw_spec), out)
    _check_counts(spec, out, written=frozenset(str(k) for k in raw_spec))
    _check_conflicts(spec, out)
    _check_resources(spec, out)
    _check_sandbox_class(spec, out)
    _check_sharing(spec, out)
    _check_reserved_keys(spec, out)
    _check_node_affinity(spec, out)
    # metadata may be missing (an error above): a check on its fields sees it empty.
    _check_annotation_size(_m(metadata), spec, out)
    _check_image(spec, out)
    return ValidationReport(tuple(out.errors), tuple(out.warnings))


def load_pool(doc: object, *, source: str = "<input>") -> model.WorkerPool:
    """Validate ``doc`` and normalise it; raises :class:`PoolValidationError` on any error."""
    report = validate_document(doc)
    if report.errors:
        raise PoolValidationError(source, report.errors)
    return model.pool_from_document(cast("Mapping[str, object]", doc))
