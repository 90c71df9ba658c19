"""Generate the WorkerPool CustomResourceDefinition.

The ``openAPIV3Schema`` comes from :data:`.schema.SPEC` (structure) and the
``x-kubernetes-validations`` from :data:`.rules.RULES` (semantics), so the API server
refuses at apply time what ``substrate-gpu pool validate`` refuses. What the CRD cannot
do: warn (the distroless-image warning is CLI and controller only), and reject unknown
fields itself (the API server prunes them; ``kubectl apply`` refuses them by default
through strict field validation).
"""

from __future__ import annotations

from substrate_gpu.pools import model, rules, schema

__all__ = ["CRD_NAME", "PLURAL", "render_crd", "to_openapi"]

PLURAL = "workerpools"
CRD_NAME = f"{PLURAL}.{model.API_GROUP}"


def to_openapi(shape: schema.SchemaField) -> dict[str, object]:
    """The structural OpenAPI v3 schema of one field."""
    out: dict[str, object] = {}
    if isinstance(shape, schema.StringField):
        out["type"] = "string"
        if shape.enum:
            out["enum"] = list(shape.enum)
        if shape.min_length:
            out["minLength"] = shape.min_length
        if shape.max_length is not None:
            out["maxLength"] = shape.max_length
        if shape.default is not None:
            out["default"] = shape.default
    elif isinstance(shape, schema.IntField):
        out.update(type="integer", format="int32")
    elif isinstance(shape, schema.IntOrStringField):
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
        out["x-kubernetes-int-or-string"] = True
        out["maxLength"] = shape.max_length
    elif isinstance(shape, schema.MapField):
        out.update(
            type="object",
            additionalProperties=to_openapi(shape.values),
            maxProperties=shape.max_properties,
        )
    elif isinstance(shape, schema.ListField):
        out.update(
            type="array",
            items=to_openapi(shape.items),
            maxItems=shape.max_items,
            **{"x-kubernetes-list-type": "atomic"},
        )
        if shape.min_items:
            out["minItems"] = shape.min_items
    else:
        out["type"] = "object"
        out["properties"] = {name: to_openapi(sub) for name, sub in shape.properties.items()}
        if shape.required:
            out["required"] = list(shape.required)
    return {"description": shape.description, **out}


def render_crd() -> dict[str, object]:
    """The WorkerPool CRD, ready for ``kubectl apply``."""
    spec_schema = to_openapi(schema.SPEC)
    spec_schema["x-kubernetes-validations"] = [
        r.to_validation() for r in rules.RULES if r.scope == "spec"
    ]
    root: dict[str, object] = {
        "description": "A pool of worker pods that run gVisor-sandboxed actors, with GPUs.",
        "type": "object",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            # Declared so the pool-name rule can name metadata.name (its fieldPath).
            "metadata": {"type": "object", "properties": {"name": {"type": "string"}}},
            "spec": spec_schema,
            "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
        },
        "x-kubernetes-validations": [r.to_validation() for r in rules.RULES if r.scope == "root"],
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": CRD_NAME},
        "spec": {
            "group": model.API_GROUP,
            "names": {
                "kind": model.KIND,
                "listKind": f"{model.KIND}List",
                "plural": PLURAL,
                "singular": "workerpool",
                "shortNames": ["wp"],
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": model.API_VERSION.rsplit("/", 1)[1],
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [
                        {"name": "Class", "type": "string", "jsonPath": ".spec.sandboxClass"},
                        {
                            "name": "Age",
                            "type": "date",
                            "jsonPath": ".metadata.creationTimestamp",
                        },
                    ],
                    "schema": {"openAPIV3Schema": root},
                }
            ],
        },
    }
