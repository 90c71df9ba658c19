"""``SUBSTRATE_GPU_REQUIRE_REAL=1`` turns every "not available here" skip into a failure."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from support import real

TESTS = Path(__file__).resolve().parent
RULE_MODULE = TESTS / "support" / "real.py"


def test_missing_skips_on_a_developer_machine(monkeypatch):
    """Without REQUIRE_REAL a missing component skips the test, naming it."""
    monkeypatch.setattr(real, "REQUIRE_REAL", False)
    with pytest.raises(pytest.skip.Exception, match="readelf is not available"):
        real.missing("readelf")


def test_missing_fails_under_require_real(monkeypatch):
    """With REQUIRE_REAL the same call fails the test, naming the component and the variable."""
    monkeypatch.setattr(real, "REQUIRE_REAL", True)
    with pytest.raises(
        pytest.fail.Exception, match=r"gcc is required here \(SUBSTRATE_GPU_REQUIRE_REAL=1\)"
    ):
        real.missing("gcc")


def _skips(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and node.attr in ("skip", "skipif", "importorskip"):
            if isinstance(node.value, ast.Name) and node.value.id == "pytest":
                found.append(f"{path.relative_to(TESTS)}:{node.lineno}: pytest.{node.attr}")
            elif isinstance(node.value, ast.Attribute) and node.value.attr == "mark":
                found.append(f"{path.relative_to(TESTS)}:{node.lineno}: pytest.mark.{node.attr}")
    return found


def test_every_skip_goes_through_the_require_real_rule():
    """No test skips on its own (gcc, readelf, openat2, glibc, ...): only support.real.missing."""
    own = [
        skip
        for path in sorted(TESTS.rglob("*.py"))
        if path not in (RULE_MODULE, Path(__file__)) and "data" not in path.relative_to(TESTS).parts
        for skip in _skips(path)
    ]
    assert own == []
