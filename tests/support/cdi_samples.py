"""Which real CDI samples under tests/data/cdi are valid specs and which are not, by name.

One table for every test that walks the samples: a parser that wrongly refuses a valid one,
or accepts an invalid one, fails wherever the samples are read (tests/cdi/).
"""

from __future__ import annotations

from pathlib import Path

DATA = Path(__file__).resolve().parents[1] / "data" / "cdi"

VALID_SAMPLES = [
    *sorted(str(p.relative_to(DATA)) for p in (DATA / "nvidia-toolkit-tests").glob("*.yaml")),
    *sorted(str(p.relative_to(DATA)) for p in (DATA / "real-world").rglob("*.yaml")),
    *sorted(str(p.relative_to(DATA)) for p in (DATA / "real-world").rglob("*.json")),
    *sorted(str(p.relative_to(DATA)) for p in (DATA / "derived").glob("*")),
    "project-oak/cdi.json",
    "cdi-repo/README-example__vendor.json",
    "cdi-repo/schema-HEAD/schema_testdata_good_minimal.json",
    "cdi-repo/schema-HEAD/schema_testdata_good_spec-example.json",
]


# Samples that are not valid specs, each tested for its precise error in test_cdi_invalid.py.
INVALID_SAMPLES = {
    "cdi-repo/README-example__vendor-annotations.json",
    "cdi-repo/schema-HEAD/schema_testdata_bad_empty.json",
    "cdi-repo/schema-HEAD/schema_testdata_bad_explicit-empty.json",
}
