"""The front door: ``substrate_gpu.__all__`` is curated, documented, importable and lazy."""

from __future__ import annotations

import ast
import importlib
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import substrate_gpu
from substrate_gpu import exceptions

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "python-api.md"
INIT = REPO / "substrate_gpu" / "__init__.py"


def documented_names() -> set[str]:
    """Every backticked name in the first column of docs/python-api.md's tables."""
    names: set[str] = set()
    for line in DOC.read_text().splitlines():
        if line.startswith("| `"):
            first_column = line.split("|")[1]
            names.update(re.findall(r"`([A-Za-z_][A-Za-z0-9_]*)`", first_column))
    return names


def test_all_is_exactly_what_the_docs_list():
    """docs/python-api.md lists every public name, and nothing that is not one."""
    assert set(substrate_gpu.__all__) == documented_names()


def test_all_has_no_duplicates():
    """Each public name appears once."""
    assert len(substrate_gpu.__all__) == len(set(substrate_gpu.__all__))


@pytest.mark.parametrize("name", substrate_gpu.__all__)
def test_public_name_imports_from_the_package(name):
    """``from substrate_gpu import <name>`` works and is the object its subpackage defines."""
    namespace: dict[str, object] = {}
    exec(f"from substrate_gpu import {name}", namespace)
    value = namespace[name]
    lazy = substrate_gpu._LAZY.get(name)
    if lazy is not None:
        module, attribute = lazy
        assert value is getattr(importlib.import_module(module), attribute)
    else:
        assert value is getattr(exceptions, name)


def test_an_unknown_name_is_an_attribute_error():
    """A name not exported raises AttributeError, naming it (subpackages still import)."""
    with pytest.raises(AttributeError, match="no attribute 'Nonexistent'"):
        substrate_gpu.Nonexistent  # noqa: B018
    from substrate_gpu import cdi

    assert cdi.parse_spec is substrate_gpu.parse_cdi_spec


def test_exported_errors_are_the_one_hierarchy():
    """Every exported exception class derives from SubstrateGpuError."""
    errors = [
        getattr(substrate_gpu, n)
        for n in substrate_gpu.__all__
        if isinstance(getattr(substrate_gpu, n), type)
        and issubclass(getattr(substrate_gpu, n), BaseException)
    ]
    assert len(errors) >= 10
    assert all(issubclass(e, exceptions.SubstrateGpuError) for e in errors)


def test_type_checking_imports_match_the_lazy_table():
    """What mypy sees (the TYPE_CHECKING imports) is what runs (the lazy table)."""
    tree = ast.parse(INIT.read_text())
    (guard,) = [
        n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING"
    ]
    seen = {
        (alias.asname or alias.name): (node.module, alias.name)
        for node in guard.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    assert seen == substrate_gpu._LAZY
    assert set(substrate_gpu.__all__) == set(seen) | {
        n for n in dir(exceptions) if n.endswith("Error")
    }


def test_importing_the_package_loads_only_the_error_hierarchy():
    """``import substrate_gpu`` stays cheap: the stand-ins import it on every invocation."""
    script = (
        "import json, sys, substrate_gpu\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('substrate_gpu'))))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    ).stdout
    assert json.loads(out) == ["substrate_gpu", "substrate_gpu.exceptions"]
