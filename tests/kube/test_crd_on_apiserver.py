"""The CRD and our manifests on a real kube-apiserver: accepted, enforced, admitted.

The API server is the judge here: its structural-schema check, its CEL compiler and cost
estimator, its admission of every example pool, its CEL verdicts on the shared table of
invalid pools (``tests/pools/pool_cases.py``), which must be the validator's own messages
on the validator's own fields, the schema checks that refuse ill-typed pools before any
CEL rule, and its server-side dry-run of the controller's manifests and every rendered
worker Deployment.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from pools.pool_cases import SEMANTIC_CASES, STRUCTURAL_CASES
from support.kube_apiserver import KubeClient, Response

from substrate_gpu.pools import crd, manifests, shaping, validate_document, validation

REPO = Path(__file__).resolve().parents[2]
EXAMPLE_FILES = sorted((REPO / "deploy" / "examples").glob("*.yaml")) + sorted(
    (REPO / "tests" / "data" / "pools" / "valid").glob("*.yaml")
)
INVALID_CASES = [case for case in SEMANTIC_CASES if case.values[1]]
CEL_CAUSE = re.compile(r'Invalid value: (?:"object": )?(?P<message>.*)', re.DOTALL)
"""A CEL rule's message in a 422's causes (the type is left out where the rule has a fieldPath)."""
SCHEMA_SAYS = {
    "type": "must be of type",
    "enum": "Unsupported value",
    "minLength": "should be at least",
    "maxLength": "Too long",
    "minItems": "should have at least",
    "required": "Required value",
}
"""The API server's wording for each structural check of pool_cases.STRUCTURAL_CASES."""


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _in_namespace(doc: dict[str, Any], namespace: str) -> dict[str, Any]:
    moved = copy.deepcopy(doc)
    moved.setdefault("metadata", {})["namespace"] = namespace
    return moved


def _as_apiserver_path(path: str) -> str:
    """The validator's ``a["b.c/d"]`` as the API server prints it: ``a.b.c/d``."""
    return re.sub(r'\["([^"]*)"\]', r".\1", path)


def _cel_message(cause: dict[str, Any]) -> str | None:
    match = CEL_CAUSE.fullmatch(cause.get("message", ""))
    return match.group("message") if match else None


def _create(admin: KubeClient, namespace: str, doc: dict[str, Any]) -> Response:
    # A create, not an apply: server-side apply cannot even type an ill-typed object (500).
    return admin.request(
        "POST",
        f"/apis/{crd.model.API_VERSION}/namespaces/{namespace}/{crd.PLURAL}",
        _in_namespace(doc, namespace),
        query={"fieldValidation": "Strict", "dryRun": "All"},
    )


def test_crd_is_accepted_structural_and_established(
    admin: KubeClient, workerpool_crd: None
) -> None:
    """The API server takes the CRD as written: structural, CEL within budget, served."""
    body = admin.ok(
        "GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd.CRD_NAME}"
    )
    conditions = {c["type"]: c for c in body["status"]["conditions"]}
    assert conditions["Established"]["status"] == "True"
    assert conditions["NamesAccepted"]["status"] == "True"
    assert "NonStructuralSchema" not in conditions


def test_checked_in_crd_is_the_generated_one() -> None:
    """deploy/crd.yaml (what users apply) is what these tests install."""
    assert yaml.safe_load((REPO / "deploy" / "crd.yaml").read_text()) == crd.render_crd()


@pytest.mark.parametrize("path", EXAMPLE_FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_example_pool_is_admitted(
    admin: KubeClient, workerpool_crd: None, namespace: str, path: Path
) -> None:
    """Every example and every valid test pool applies (strict: no field is dropped)."""
    for doc in _docs(path):
        response = admin.apply(_in_namespace(doc, namespace))
        assert response.status in (200, 201), response.body
        stored = response.body["spec"]
        # Nothing the user wrote was pruned (defaults may be added).
        assert stored | doc["spec"] == stored


@pytest.mark.parametrize(("doc", "codes"), INVALID_CASES)
def test_the_api_server_rejects_each_invalid_pool_with_the_validators_messages(
    admin: KubeClient, workerpool_crd: None, namespace: str, doc: dict[str, Any], codes: set[Any]
) -> None:
    """Each problem `pool validate` reports, the API server's CEL reports: same field, same
    message (values filled in by messageExpression), and nothing else."""
    python = validate_document(doc).errors
    assert {p.code for p in python} == codes
    response = _create(admin, namespace, doc)
    assert response.status == 422, response.body
    assert sorted((c.get("field"), _cel_message(c)) for c in response.causes) == sorted(
        (p.path, p.message) for p in python
    )


@pytest.mark.parametrize(("doc", "codes", "check"), STRUCTURAL_CASES)
def test_the_api_server_rejects_each_ill_typed_pool_by_schema_before_cel(
    admin: KubeClient,
    workerpool_crd: None,
    namespace: str,
    doc: dict[str, Any],
    codes: set[Any],
    check: str,
) -> None:
    """Ill-typed pools are refused by the schema check the table names, on the validator's
    field, in the API server's own words (CEL only ever sees a well-typed object)."""
    (problem,) = validate_document(doc).errors
    field = _as_apiserver_path(problem.path)
    response = _create(admin, namespace, doc)
    if check == "unknown":
        assert response.status == 400, response.body
        assert f'unknown field "{field}"' in response.body["message"]
        return
    assert response.status == 422, response.body
    assert any(
        c.get("field") == field and SCHEMA_SAYS[check] in c["message"] for c in response.causes
    ), response.causes


def test_controller_manifest_passes_server_side_dry_run(admin: KubeClient) -> None:
    """deploy/controller.yaml: account, ClusterRole, binding and Deployment pass admission."""
    admin.create_namespace(manifests.AGENT_NAMESPACE)
    docs = _docs(REPO / "deploy" / "controller.yaml")
    assert {d["kind"] for d in docs} >= {"ServiceAccount", "ClusterRole", "Deployment"}
    for doc in docs:
        response = admin.apply(doc, dry_run=True)
        assert response.status in (200, 201), (doc["kind"], response.body)


@pytest.mark.parametrize(
    "path", sorted((REPO / "deploy" / "rendered").glob("*.yaml")), ids=lambda p: p.name
)
def test_checked_in_worker_deployments_pass_server_side_dry_run(
    admin: KubeClient, namespace: str, path: Path
) -> None:
    """Every rendered worker Deployment in deploy/rendered passes the API server's admission."""
    for doc in _docs(path):
        response = admin.apply(_in_namespace(doc, namespace), dry_run=True)
        assert response.status in (200, 201), response.body


@pytest.mark.parametrize("path", EXAMPLE_FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_freshly_rendered_worker_deployments_pass_server_side_dry_run(
    admin: KubeClient, namespace: str, path: Path
) -> None:
    """The renderer's output for each example (GPU shape, toolkit mount, env) is admitted."""
    settings = shaping.ControllerSettings(driver_root="/usr/local/nvidia", default_image="ateom:1")
    for document in manifests.read_documents(path):
        pool = validation.load_pool(document.content, source=document.source)
        deployment = shaping.render_worker_deployment(pool, settings)
        response = admin.apply(_in_namespace(deployment, namespace), dry_run=True)
        assert response.status in (200, 201), response.body
