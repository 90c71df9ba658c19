"""The WorkerPool typed dicts (substrate_gpu/pools/bodies.py) hold to the CRD and real pools."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from support.typeddicts import declared_tree, problems

from substrate_gpu.pools import bodies, render_crd

VALID = Path(__file__).resolve().parents[1] / "data" / "pools" / "valid"


def _crd_tree(schema: dict[str, object]) -> dict[str, object] | None:
    """``{field: subtree}`` of an OpenAPI object schema (arrays descend into their items)."""
    while schema.get("type") == "array":
        schema = schema["items"]  # type: ignore[assignment]
    properties = schema.get("properties")
    if not isinstance(properties, dict):
        return None
    return {name: _crd_tree(sub) for name, sub in properties.items()}


def test_the_body_declares_exactly_the_crds_fields():
    """Every field of the CRD's schema, at every depth, is declared, and nothing else is.

    ``metadata`` is Kubernetes' ObjectMeta, which a CRD schema never spells out."""
    (version,) = render_crd()["spec"]["versions"]  # type: ignore[index]
    crd = _crd_tree(version["schema"]["openAPIV3Schema"])
    declared = declared_tree(bodies.WorkerPoolBody)
    assert crd is not None
    assert {k: v for k, v in declared.items() if k != "metadata"} == {
        k: v for k, v in crd.items() if k != "metadata"
    }


@pytest.mark.parametrize("path", sorted(VALID.glob("*.yaml")), ids=lambda p: p.name)
def test_valid_pools_are_declared_field_by_field(path):
    """Each valid example pool uses only declared fields, each of its declared type."""
    for document in yaml.safe_load_all(path.read_text()):
        if document and document.get("kind") == "WorkerPool":
            assert problems(document, bodies.WorkerPoolBody, closed=True) == []
