"""The Python validator: every problem in one pass, with field paths and stable codes."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pool_cases import IMAGE, SEMANTIC_CASES, STRUCTURAL_CASES, flat, pool, upstream

from substrate_gpu.pools import Code, PoolValidationError, load_pool, schema, validate_document
from substrate_gpu.pools.model import GPU_RESOURCES


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


@pytest.mark.parametrize(
    ("spec", "nearest"),
    [
        pytest.param(flat(maxWorker=3), "maxWorkers", id="spec"),
        pytest.param(flat(workerimage=IMAGE), "workerImage", id="case"),
        pytest.param(
            upstream({"cpu": 1}) | {"template": {"tolerations": [{"efect": "NoSchedule"}]}},
            "effect",
            id="nested",
        ),
    ],
)
def test_an_unknown_field_names_the_nearest_known_one(spec: dict, nearest: str) -> None:
    """A misspelt field's error suggests the field it is closest to, then lists them all."""
    (problem,) = validate_document(pool(spec)).errors
    assert problem.message.startswith(f"unknown field: did you mean {nearest}? (known: ")


def test_an_unknown_field_far_from_every_known_one_only_lists_them() -> None:
    (problem,) = validate_document(pool(flat(colour="blue"))).errors
    assert problem.message.startswith("unknown field (known: nodeSelector, ")


def test_a_gpu_typo_says_what_it_is_and_names_the_resource_meant() -> None:
    """nvidia.com/gpus is refused as a misspelt nvidia.com/gpu, on the map it is in."""
    (problem,) = validate_document(
        pool({"resourceRequests": {"nvidia.com/gpus": "1"}, "maxWorkers": 10})
    ).errors
    assert (problem.path, problem.code) == ("spec.resourceRequests", Code.GPU_RESOURCE_TYPO)
    assert problem.message == (
        "nvidia.com/gpus is not nvidia.com/gpu, one edit away: did you mean nvidia.com/gpu? "
        "(a misspelt GPU resource gets the workers no GPU)"
    )


@pytest.mark.parametrize("name", sorted(GPU_RESOURCES))
def test_no_recognised_gpu_resource_is_taken_for_a_typo(name: str) -> None:
    """A recognised name is never a misspelling of another (other vendors are refused, but
    for another reason)."""
    codes = {p.code for p in validate_document(pool(upstream(None, {name: 1}))).errors}
    assert Code.GPU_RESOURCE_TYPO not in codes


def test_ateom_image_is_read_as_worker_image_with_a_deprecation_warning() -> None:
    """The former name still works (same model), and says to write workerImage."""
    old = validate_document(pool(flat(ateomImage=IMAGE)))
    assert old.errors == ()
    assert [(w.path, w.code) for w in old.warnings] == [("spec.ateomImage", Code.DEPRECATED_FIELD)]
    assert "write workerImage" in old.warnings[0].message
    assert load_pool(pool(flat(ateomImage=IMAGE))) == load_pool(pool(flat(workerImage=IMAGE)))


@pytest.mark.parametrize(
    "doc",
    [
        pytest.param({"spec": {"resourceRequests": {"nvidia.com/gpu": "1"}}}, id="spec-alone"),
        pytest.param({"apiVersion": "x", "kind": "WorkerPool", "spec": {}}, id="no-metadata"),
        pytest.param({"metadata": None, "spec": {"maxWorkers": 1}}, id="null-metadata"),
        pytest.param({"metadata": ["p"], "spec": {"maxWorkers": 1}}, id="list-metadata"),
    ],
)
def test_a_document_without_metadata_is_reported_not_raised(doc: dict) -> None:
    """A spec pasted alone (a docs snippet) is an error naming metadata, not an exception."""
    report = validate_document(doc)
    assert "metadata" in [p.path for p in report.errors]


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
    report = validate_document(pool(flat(workerImage=image)))
    assert report.ok
    assert [(w.path, w.code) for w in report.warnings] == [
        ("spec.workerImage", Code.DISTROLESS_IMAGE)
    ]


@pytest.mark.parametrize(
    "doc",
    [
        # A glibc image is fine.
        pytest.param(pool(flat(workerImage=IMAGE)), id="glibc-gpu"),
        # Without a GPU nvidia-ctk never runs: a distroless CPU worker is fine.
        pytest.param(
            pool(upstream({"cpu": 1}) | {"workerImage": "gcr.io/distroless/static"}),
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


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=12,
)
_FIELDS = st.sampled_from(
    [
        "apiVersion",
        "kind",
        "metadata",
        "spec",
        "name",
        "annotations",
        *schema.SPEC.properties,
        "resources",
        "requests",
        "limits",
        "tolerations",
        "nodeAffinity",
        "imagePullSecrets",
        "nodeSelectorTerms",
        "matchExpressions",
        "preferredDuringSchedulingIgnoredDuringExecution",
    ]
)
_POOLISH = st.recursive(
    _JSON, lambda inner: st.dictionaries(_FIELDS, inner, max_size=4), max_leaves=20
)


@settings(max_examples=60, deadline=None)
@given(_POOLISH)
def test_validation_never_raises(doc: object) -> None:
    """Whatever a file holds (the pool's field names at any depth, any values), validation
    reports problems and never raises."""
    report = validate_document(doc)
    assert report.ok or report.errors
