"""The Python validator: every problem in one pass, with field paths and stable codes."""

from __future__ import annotations

import pytest
from pool_cases import IMAGE, SEMANTIC_CASES, STRUCTURAL_CASES, flat, pool, upstream

from substrate_gpu.pools import Code, PoolValidationError, load_pool, validate_document


@pytest.mark.parametrize(("doc", "codes"), SEMANTIC_CASES)
def test_semantic_cases(doc: dict, codes: set[Code]) -> None:
    """The validator reports exactly the expected problem codes for each semantic case."""
    assert {p.code for p in validate_document(doc).errors} == codes


@pytest.mark.parametrize(("doc", "codes", "check"), STRUCTURAL_CASES)
def test_structural_cases(doc: dict, codes: set[Code], check: str) -> None:
    """Ill-typed documents are refused with structural codes only."""
    assert {p.code for p in validate_document(doc).errors} == codes


@pytest.mark.parametrize(
    ("doc", "path"),
    [
        # A rule about a map's entries names the map (the CRD's fieldPath cannot name a
        # key the rule finds), and the message names the entries.
        pytest.param(
            pool(upstream(None, {"nvidia.com/gpu": 1}, sandboxClass="microvm")),
            "spec.template.resources.limits",
            id="gpu-limit",
        ),
        pytest.param(pool(flat("0")), "spec.resourceRequests", id="flat-gpu"),
        # Type errors name the entry; paths quote keys that are not identifiers, as kubectl does.
        pytest.param(pool(flat(True)), 'spec.resourceRequests["nvidia.com/gpu"]', id="bool-gpu"),
        pytest.param(pool(flat(maxWorkers=0)), "spec.maxWorkers", id="max-workers"),
        pytest.param(
            pool(upstream({"cpu": 1}) | {"template": {"tolerations": [{"effect": "Later"}]}}),
            "spec.template.tolerations[0].effect",
            id="list-index",
        ),
        pytest.param(pool(flat(maxWorker=3)), "spec.maxWorker", id="unknown-field"),
    ],
)
def test_problem_paths(doc: dict, path: str) -> None:
    """Each problem names the field it is about."""
    assert [p.path for p in validate_document(doc).errors] == [path]


def test_gpu_on_microvm_message_is_upstreams() -> None:
    """The GPU-class error reads exactly as the upstream CRD's."""
    (problem,) = validate_document(
        pool(upstream(None, {"nvidia.com/gpu": 1}, sandboxClass="microvm"))
    ).errors
    assert problem.message == "nvidia.com/gpu is only supported when sandboxClass is 'gvisor'"


@pytest.mark.parametrize("resource", ["amd.com/gpu", "gpu.intel.com/i915"])
def test_other_vendor_message_gives_the_reason(resource: str) -> None:
    """Other vendors' GPUs are refused with the reason: nvproxy is NVIDIA-only."""
    (problem,) = validate_document(pool(upstream(None, {resource: 1}))).errors
    assert resource in problem.message
    assert "nvproxy is NVIDIA-only" in problem.message


def test_unknown_field_is_an_error() -> None:
    """A misspelt field is refused rather than silently ignored."""
    codes = [p.code for p in validate_document(pool(flat(maxWorker=3))).errors]
    assert codes == [Code.UNKNOWN_FIELD]


def test_structural_and_semantic_problems_are_reported_together() -> None:
    """A type error in one field does not hide a semantic error in another."""
    doc = pool(flat("0", runtimeClassName=5))
    assert {p.code for p in validate_document(doc).errors} == {Code.TYPE, Code.RESOURCE_COUNT}


@pytest.mark.parametrize(
    "doc",
    [
        pytest.param(None, id="empty"),
        pytest.param(["a"], id="list"),
        pytest.param({"kind": "Pod"}, id="other-kind"),
    ],
)
def test_non_pools_are_refused_without_raising(doc: object) -> None:
    """Anything that is not a WorkerPool is reported, never raised."""
    assert not validate_document(doc).ok


@pytest.mark.parametrize(
    "image",
    [
        "gcr.io/distroless/static-debian12:nonroot",
        "gcr.io/distroless/base",
        "cgr.dev/chainguard/static:latest",
    ],
)
def test_distroless_gpu_image_warns(image: str) -> None:
    """A GPU pool on a distroless image gets a warning, not an error."""
    report = validate_document(pool(flat(ateomImage=image)))
    assert report.ok
    assert [w.code for w in report.warnings] == [Code.DISTROLESS_IMAGE]


@pytest.mark.parametrize(
    "doc",
    [
        # A glibc image is fine.
        pytest.param(pool(flat(ateomImage=IMAGE)), id="glibc-gpu"),
        # Without a GPU nvidia-ctk never runs: a distroless CPU worker is fine.
        pytest.param(
            pool(upstream({"cpu": 1}) | {"ateomImage": "gcr.io/distroless/static"}),
            id="distroless-cpu",
        ),
    ],
)
def test_no_distroless_warning(doc: dict) -> None:
    """The distroless warning is only for GPU pools on distroless images."""
    assert validate_document(doc).warnings == ()


def test_load_pool_raises_with_every_problem() -> None:
    """load_pool refuses an invalid document and carries all of its problems."""
    with pytest.raises(PoolValidationError) as info:
        load_pool(pool(flat("0", maxWorkers=0)), source="f.yaml")
    assert {p.code for p in info.value.problems} == {Code.RESOURCE_COUNT, Code.WORKER_COUNT}
    assert "f.yaml" in str(info.value)


@pytest.mark.parametrize(
    ("where", "path"),
    [
        pytest.param("metadata", "metadata.annotations", id="pool-metadata"),
        pytest.param("spec", "spec.annotations", id="flat"),
        pytest.param("template", "spec.template.annotations", id="template"),
    ],
)
def test_annotations_over_256_kib_are_refused(where: str, path: str) -> None:
    """Annotations over Kubernetes' 256 KiB total (keys and values) are refused, as the API
    server refuses them; exactly 256 KiB passes."""
    key = "example.com/blob"

    def doc(size: int) -> dict:
        annotations = {key: "x" * (size - len(key))}
        spec = flat()
        document = pool(spec)
        if where == "metadata":
            document["metadata"]["annotations"] = annotations
        elif where == "spec":
            spec["annotations"] = annotations
        else:
            spec["template"] = {"annotations": annotations}
        return document

    assert validate_document(doc(256 * 1024)).errors == ()
    report = validate_document(doc(256 * 1024 + 1))
    assert [(p.path, p.code) for p in report.errors] == [(path, Code.ANNOTATIONS_TOO_LONG)]
    assert "262144 bytes" in report.errors[0].message
