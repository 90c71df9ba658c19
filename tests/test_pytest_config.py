"""The suite's pytest configuration keeps a test that tests nothing from passing."""

from __future__ import annotations

import pytest


def test_an_empty_parametrisation_fails_at_collection(pytestconfig: pytest.Config) -> None:
    """A glob- or table-fed parametrisation that comes out empty is a collection error, not
    one skipped test nobody reads (pytest's default)."""
    assert pytestconfig.getini("empty_parameter_set_mark") == "fail_at_collect"


def test_warnings_are_errors(pytestconfig: pytest.Config) -> None:
    assert pytestconfig.getini("filterwarnings") == ["error"]
