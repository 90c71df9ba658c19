"""Rendered manifests: valid for real Kubernetes schemas, and the checked-in copies fresh."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]  # ships no py.typed; test-only
import pytest
import yaml
from pool_cases import IMAGE, pool

from substrate_gpu.pools import (
    ControllerSettings,
    PoolFileError,
    crd,
    load_pool,
    manifests,
    parse_documents,
    render_crd,
    render_worker_deployment,
    rules,
)

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
EXAMPLES = ROOT / "tests" / "data" / "pools" / "valid"
KUBERNETES = "1.30.0"
"""The oldest Kubernetes whose CRDs support every feature we use (CEL messages, 1.25+)."""
WORKER_KUBERNETES = "1.34.0"
"""The oldest Kubernetes with the ``podCertificate`` projection a GPU worker's report to
atelet needs (as upstream's workers do; docs/worker-api.md, "Registering with atelet")."""
REGENERATE = (
    "regenerate with: substrate-gpu pool deploy-files --examples tests/data/pools/valid "
    "--output deploy"
)


def k8s_validate(obj: dict[str, Any], version: str = KUBERNETES) -> None:
    kubernetes_validate.validate(obj, version, strict=True)


def example_pools() -> list[Path]:
    return sorted(EXAMPLES.glob("*.yaml"))


def test_crd_is_valid_kubernetes() -> None:
    """The CRD passes Kubernetes' own CustomResourceDefinition schema (strict)."""
    k8s_validate(render_crd())


def test_crd_carries_every_cel_rule() -> None:
    """Every CEL rule is in the CRD, at the scope it was written for."""
    schema = render_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]  # type: ignore[index]
    in_crd = (
        schema["x-kubernetes-validations"]
        + schema["properties"]["spec"]["x-kubernetes-validations"]
    )
    assert in_crd == [r.to_validation() for r in rules.RULES if r.scope == "root"] + [
        r.to_validation() for r in rules.RULES if r.scope == "spec"
    ]


def test_crd_defaults_sandbox_class_to_gvisor() -> None:
    """sandboxClass defaults to gvisor, as upstream."""
    spec = crd.render_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"][  # type: ignore[index]
        "properties"
    ]["spec"]
    assert spec["properties"]["sandboxClass"]["default"] == "gvisor"


@pytest.mark.parametrize("path", example_pools(), ids=lambda p: p.stem)
def test_example_deployments_are_valid_kubernetes(path: Path) -> None:
    """Every example pool's worker Deployment passes the apps/v1 schema (strict)."""
    for doc in manifests.read_documents(path):
        settings = ControllerSettings(driver_root="/x", default_image=IMAGE)
        k8s_validate(render_worker_deployment(load_pool(doc.content), settings), WORKER_KUBERNETES)


def test_deploy_ships_no_privileged_node_agent() -> None:
    """No DaemonSet and nothing privileged, no user namespace, no unmasked /proc: the agent
    runs in each GPU worker's container, with upstream's unprivileged worker posture."""
    pods = 0
    for path in sorted(DEPLOY.rglob("*.yaml")):
        text = path.read_text(encoding="utf-8")
        for doc in yaml.safe_load_all(text):
            assert doc["kind"] != "DaemonSet", path
            pod = doc.get("spec", {}).get("template", {}).get("spec")
            if pod is None:
                continue
            pods += 1
            assert "hostUsers" not in pod, path
            for container in pod["containers"]:
                context = container.get("securityContext", {})
                assert context.get("privileged", False) is False, path
                assert "procMount" not in context, path
                assert context.get("allowPrivilegeEscalation") is not True, path
                assert context.get("capabilities", {}).get("drop", ["ALL"]) == ["ALL"], path
    assert pods >= 7  # the controller and every example pool's workers


def test_checked_in_deploy_files_are_not_stale() -> None:
    """deploy/ holds exactly what the code generates today."""
    expected = manifests.deploy_files(example_pools())
    on_disk = {
        str(p.relative_to(DEPLOY)): p.read_text(encoding="utf-8") for p in DEPLOY.rglob("*.yaml")
    }
    assert sorted(on_disk) == sorted(expected), REGENERATE
    for name, content in expected.items():
        assert on_disk[name] == content, f"deploy/{name} is stale; {REGENERATE}"


def test_checked_in_manifests_are_valid_kubernetes() -> None:
    """Every built-in object under deploy/ passes the Kubernetes schemas (strict)."""
    checked = 0
    for path in sorted(DEPLOY.rglob("*.yaml")):
        for obj in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if obj["kind"] != "WorkerPool":
                rendered = path.parent.name == "rendered"
                k8s_validate(obj, WORKER_KUBERNETES if rendered else KUBERNETES)
                checked += 1
    assert checked >= 8


def test_multi_document_file_names_each_document() -> None:
    """Documents of a multi-document file are numbered and keep their start line."""
    text = "a: 1\n---\n---\nb: 2\n"
    docs = parse_documents(text, "f.yaml")
    assert [(d.source, d.line, d.content) for d in docs] == [
        ("f.yaml#1", 1, {"a": 1}),
        ("f.yaml#2", 4, {"b": 2}),
    ]


def test_single_document_keeps_the_plain_file_name() -> None:
    """A one-document file is named without a document number."""
    assert [d.source for d in parse_documents(yaml.safe_dump(pool({})), "f.yaml")] == ["f.yaml"]


@pytest.mark.parametrize(
    ("text", "where"),
    [
        pytest.param("a: [1, 2\nb: 3\n", "f.yaml:2:", id="unclosed-flow"),
        pytest.param("a: 1\n b: 2\n", "f.yaml:2:", id="bad-indent"),
        pytest.param("a: 1\n---\nkey: 'x\n", "f.yaml:4:", id="second-document"),
    ],
)
def test_bad_yaml_names_file_and_line(text: str, where: str) -> None:
    """Invalid YAML is reported with the file, line and column."""
    with pytest.raises(PoolFileError, match=f"while reading {where}"):
        parse_documents(text, "f.yaml")


@pytest.mark.parametrize(
    ("text", "where", "problem"),
    [
        pytest.param(
            "metadata:\n  name: a\x00b\n", "f.yaml:2:10", "character '\\x00'", id="nul-byte"
        ),
        pytest.param("a: " + "[" * 100_000, "f.yaml:1:", "nesting", id="deep-flow"),
        pytest.param(
            "".join(" " * i + "k:\n" for i in range(5_000)), "f.yaml:", "nesting", id="deep-block"
        ),
    ],
)
def test_hostile_yaml_is_one_line_error(text: str, where: str, problem: str) -> None:
    """A NUL byte or a document nested thousands deep is a one-line PoolYamlError naming the
    file and place, not a ReaderError or RecursionError traceback."""
    with pytest.raises(manifests.PoolYamlError) as caught:
        parse_documents(text, "f.yaml")
    message = str(caught.value)
    assert message.startswith(f"while reading {where}")
    assert problem in message
    assert "\n" not in message


def test_pool_files_are_read_with_the_c_loader(monkeypatch: pytest.MonkeyPatch) -> None:
    """The C loader the project wraps (substrate_gpu._yaml), not PyYAML's pure-Python one
    (a 10 MB annotation took 35 s)."""
    from substrate_gpu import _yaml

    assert _yaml.SafeLoader is yaml.CSafeLoader
    built: list[object] = []
    real = _yaml.SafeLoader
    monkeypatch.setattr(_yaml, "SafeLoader", lambda text: built.append(text) or real(text))
    assert parse_documents("a: 1\n", "f.yaml")[0].content == {"a": 1}
    assert built == ["a: 1\n"]


def test_manifests_are_written_by_the_c_emitter_without_aliases() -> None:
    """``pool render``/``crd`` write through libyaml's emitter (the pure-Python one was
    most of ``pool crd``), and an object reused in a manifest is written out, not aliased."""
    from substrate_gpu import _yaml

    assert issubclass(manifests._PlainDumper, yaml.CSafeDumper)
    assert _yaml.SafeDumper is yaml.CSafeDumper
    shared = {"name": "x"}
    text = manifests.dump_documents([{"a": shared, "b": shared}])
    assert text == "---\na:\n  name: x\nb:\n  name: x\n"


def test_unreadable_file_is_a_pool_file_error(tmp_path: Path) -> None:
    """A missing file is a clear PoolFileError naming it."""
    with pytest.raises(PoolFileError, match="missing.yaml"):
        manifests.read_documents(tmp_path / "missing.yaml")


def test_controller_rbac_names_every_resource_and_verb_it_grants() -> None:
    """Least privilege: no wildcard, and only pools, their Deployments, Events and CRDs."""
    [role] = [
        o
        for o in manifests.controller_manifests(ControllerSettings())
        if o["kind"] == "ClusterRole"
    ]
    granted = {
        (group, resource, verb)
        for rule in role["rules"]  # type: ignore[attr-defined]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    assert not any("*" in part for grant in granted for part in grant)
    assert {resource for _, resource, _ in granted} == {
        "workerpools",
        "workerpools/status",
        "workerpools/finalizers",
        "deployments",
        "events",
        "customresourcedefinitions",
    }
    # Deployments are addressed by name: never listed or watched, so never read in bulk.
    assert {v for _, r, v in granted if r == "deployments"} == {"get", "create", "patch", "delete"}


def test_controller_pod_runs_unprivileged_and_alone() -> None:
    """One replica replaced with Recreate (kopf standalone), non-root, no escalation."""
    deployment = manifests.controller_manifests(ControllerSettings())[-1]
    spec = deployment["spec"]  # type: ignore[index]
    assert (spec["replicas"], spec["strategy"]) == (1, {"type": "Recreate"})
    pod = spec["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    security = pod["containers"][0]["securityContext"]
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
