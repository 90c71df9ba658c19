"""The CDI wire format's typed dicts (substrate_gpu/cdi/bodies.py) hold to the real thing.

The parser derives the fields it knows from these, so they are checked against the CDI
project's JSON schemas (HEAD and v1.0.1, copied under tests/data/cdi-schemas) and against
every real spec in the test data.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from support.cdi_samples import INVALID_SAMPLES, VALID_SAMPLES
from support.typeddicts import problems

from substrate_gpu import exceptions
from substrate_gpu.cdi import bodies, parse_spec
from substrate_gpu.cdi import parse as parse_module

DATA = Path(__file__).resolve().parents[1] / "data" / "cdi"
SCHEMAS = DATA.parent / "cdi-schemas"
#: In the reference library's Go type (``DeviceNode.FileMode``) but in no JSON schema.
GO_ONLY = {"DeviceNodeBody": {"fileMode"}}


def _schema(version: str) -> tuple[dict[str, object], dict[str, dict[str, object]]]:
    prefix = "schema_" if version == "schema-HEAD" else ""
    spec = json.loads((SCHEMAS / version / f"{prefix}schema.json").read_text())
    defs = json.loads((SCHEMAS / version / f"{prefix}defs.json").read_text())["definitions"]
    return spec, defs


def _schema_objects(version: str) -> dict[str, dict[str, object]]:
    """Each CDI object's schema (``properties`` and ``required``), by our body's name."""
    spec, defs = _schema(version)
    device = spec["properties"]["devices"]["items"]  # type: ignore[index]
    edits = defs["containerEdits"]
    objects = {
        "SpecBody": spec,
        "DeviceBody": device,
        "ContainerEditsBody": edits,
        "DeviceNodeBody": defs["DeviceNode"],
        "MountBody": defs["Mount"],
        "HookBody": defs["Hook"],
        "IntelRdtBody": edits["properties"]["intelRdt"],  # type: ignore[index]
    }
    if "LinuxNetDevice" in defs:
        objects["NetDeviceBody"] = defs["LinuxNetDevice"]
    return objects


BODY_NAMES = sorted(_schema_objects("schema-HEAD"))


@pytest.mark.parametrize("name", BODY_NAMES)
def test_body_fields_are_the_schemas_fields(name):
    """Each body declares exactly the fields of the HEAD and v1.0.1 schemas (plus Go-only ones)."""
    schema_fields = set(GO_ONLY.get(name, set()))
    for version in ("schema-HEAD", "schema-v1.0.1"):
        obj = _schema_objects(version).get(name)
        if obj is not None:
            schema_fields |= set(obj["properties"])  # type: ignore[arg-type]
    assert bodies.fields_of(getattr(bodies, name)) == schema_fields


@pytest.mark.parametrize("name", BODY_NAMES)
def test_body_required_fields_are_the_schemas(name):
    """``Required`` marks exactly what the HEAD schema requires."""
    required = set(_schema_objects("schema-HEAD")[name].get("required", []))  # type: ignore[arg-type]
    assert set(getattr(bodies, name).__required_keys__) == required


def test_the_parser_knows_exactly_the_bodies_fields():
    """The parser's unknown-field check uses the bodies' field sets, not a copy."""
    assert bodies.fields_of(bodies.DeviceNodeBody) == parse_module._NODE_FIELDS
    assert bodies.fields_of(bodies.ContainerEditsBody) == parse_module._EDITS_FIELDS
    assert bodies.fields_of(bodies.SpecBody) == parse_module._SPEC_FIELDS


def test_fields_of_refuses_a_plain_class():
    """fields_of names the mistake when given something that is not a TypedDict."""
    with pytest.raises(TypeError, match="not a TypedDict"):
        bodies.fields_of(dict)


@pytest.mark.parametrize("relative", [pytest.param(r, id=r) for r in VALID_SAMPLES])
def test_every_valid_real_spec_conforms_to_spec_body(relative, sample_text):
    """Every real spec that is valid (support/cdi_samples.py, by name) parses, and has the
    types the bodies declare, field by field: a parser that refused one fails here."""
    text = sample_text(relative)
    parse_spec(text, source=relative)
    assert problems(yaml.safe_load(text), bodies.SpecBody) == []


@pytest.mark.parametrize("relative", [pytest.param(r, id=r) for r in sorted(INVALID_SAMPLES)])
def test_every_invalid_real_spec_is_refused(relative, sample_text):
    """The samples kept as invalid are refused (their precise errors: test_cdi_invalid.py)."""
    with pytest.raises(exceptions.CdiSpecError):
        parse_spec(sample_text(relative), source=relative)
