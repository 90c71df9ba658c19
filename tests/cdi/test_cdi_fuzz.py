"""Property tests: whatever the input, parse_spec returns a Spec or raises CdiSpecError."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable
from pathlib import Path

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from substrate_gpu import cdi
from substrate_gpu.exceptions import CdiSpecError, MigDeviceRefused

DATA = Path(__file__).resolve().parent.parent / "data" / "cdi"
SEEDS = [
    "real-world/ramalama/CDI_JSON_2.json",
    "real-world/ramalama/CDI_YAML_1.yaml",
    "derived/DERIVED__v1.20.0__generate_test__default__driverRoot=DRIVER_ROOT.json",
    "cdi-repo/schema-HEAD/schema_testdata_good_spec-example.json",
    "project-oak/cdi.json",
]
SEED_TEXTS = [(DATA / seed).read_text(encoding="utf-8") for seed in SEEDS]
SEED_DOCS = [yaml.safe_load(text) for text in SEED_TEXTS]

# Modest by default (the suite must stay fast on 2 cores); raise CDI_FUZZ_EXAMPLES for a soak.
FUZZ = settings(
    max_examples=int(os.environ.get("CDI_FUZZ_EXAMPLES", "60")),
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# JSON-ish garbage, plus the YAML-only scalars a safe loader can produce.
GARBAGE = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True)
    | st.text(max_size=12)
    | st.sampled_from(["", "/", "all", "rwm", "createContainer", "0.7.0", "A=B", "=", "c"]),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)


def parse_or_refuse(data: str | bytes) -> None:
    """The property: a Spec, or a CdiSpecError whose parts are strings."""
    try:
        spec = cdi.parse_spec(data, source="fuzz")
    except CdiSpecError as e:
        assert isinstance(e.field, str)
        assert isinstance(e.problem, str)
        assert e.problem
        return
    assert isinstance(spec, cdi.Spec)
    with contextlib.suppress(CdiSpecError, MigDeviceRefused):
        cdi.edits_for_all(spec)


def paths(node: object, prefix: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
    """Every key/index path inside a decoded document."""
    found = [prefix]
    if isinstance(node, dict):
        for key, value in node.items():
            found += paths(value, (*prefix, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            found += paths(value, (*prefix, index))
    return found


def mutate(doc: object, path: tuple[object, ...], action: str, garbage: object) -> object:
    """A deep copy of ``doc`` with the value at ``path`` deleted or replaced by ``garbage``."""
    copy = json.loads(json.dumps(doc))
    if not path:
        return garbage
    parent = copy
    for key in path[:-1]:
        parent = parent[key]
    if action == "delete":
        del parent[path[-1]]
    else:
        parent[path[-1]] = garbage
    return copy


def render(doc: object, style: str) -> str:
    if style == "json":
        return json.dumps(doc, separators=(",", ":"))
    if style == "json-pretty":
        return json.dumps(doc, indent=2)
    return yaml.safe_dump(doc, sort_keys=False, indent=4)


@FUZZ
@given(data=st.data())
def test_structural_mutations_of_real_specs(data: st.DataObject) -> None:
    """Deleting keys, changing types or inserting garbage anywhere never escapes CdiSpecError."""
    doc = data.draw(st.sampled_from(SEED_DOCS))
    for _ in range(data.draw(st.integers(min_value=1, max_value=3))):
        path = data.draw(st.sampled_from(paths(doc)))
        action = data.draw(st.sampled_from(["delete", "replace"])) if path else "replace"
        doc = mutate(doc, path, action, data.draw(GARBAGE))
    parse_or_refuse(render(doc, data.draw(st.sampled_from(["json", "json-pretty", "yaml"]))))


@FUZZ
@given(seed=st.sampled_from(SEED_TEXTS), cut=st.floats(min_value=0, max_value=1))
def test_truncated_specs(seed: str, cut: float) -> None:
    """A spec cut anywhere (a torn write) is refused or, rarely, still valid."""
    parse_or_refuse(seed[: int(len(seed) * cut)])


@FUZZ
@given(
    seed=st.sampled_from(SEED_TEXTS),
    edits=st.lists(
        st.tuples(st.floats(min_value=0, max_value=1), st.text(max_size=4)), min_size=1, max_size=4
    ),
)
def test_text_level_corruption(seed: str, edits: list[tuple[float, str]]) -> None:
    """Random characters spliced into the text never escape CdiSpecError."""
    text = seed
    for where, insert in edits:
        at = int(len(text) * where)
        text = text[:at] + insert + text[at + 1 :]
    parse_or_refuse(text)


@FUZZ
@given(blob=st.binary(max_size=300))
def test_random_bytes(blob: bytes) -> None:
    """Arbitrary bytes are refused cleanly (or, by chance, parse)."""
    parse_or_refuse(blob)


@FUZZ
@given(prefix=st.sampled_from(["{", "---\n", "a: ", "- ", "["]), garbage=st.text(max_size=200))
def test_random_text_after_a_plausible_start(prefix: str, garbage: str) -> None:
    """Text that starts like JSON or YAML and goes anywhere is refused cleanly."""
    parse_or_refuse(prefix + garbage)


def test_property_holds_for_the_seeds_themselves(sample_text: Callable[[str], str]) -> None:
    """The seeds are valid specs (so mutations start from real, accepted input)."""
    for seed in SEEDS:
        assert cdi.parse_spec(sample_text(seed)).devices
