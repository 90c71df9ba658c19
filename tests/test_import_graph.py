"""Production modules never import the test kit (``substrate_gpu.testing``) or the demo.

The rule (docs/gpu-injection.md, "Stand-ins"): the simulated node, the tool stand-ins and the
in-process sandboxes live in the public test kit; only the demo may use them. "Demo" means
:mod:`substrate_gpu.testing.demo` itself, reached from the CLI only lazily (inside the handler of
``demo`` and of ``agent --demo``), so ``import substrate_gpu.cli`` loads neither.

Two checks: a static walk of every ``import`` statement (function-local ones included) that
names the offending module and line, and a runtime check that importing every production
module in a fresh interpreter loads no kit module.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE_DIR = Path(__file__).resolve().parents[1] / "substrate_gpu"
KIT = "substrate_gpu.testing"
DEMO = "substrate_gpu.testing.demo"
#: Production modules allowed to import the demo, and only inside a function.
DEMO_ENTRY_POINTS = frozenset({"substrate_gpu.cli._demo", "substrate_gpu.cli._agent"})


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def all_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE_DIR.rglob("*.py"))}


def is_kit_or_demo(name: str) -> bool:
    return name in (KIT, DEMO) or name.startswith(KIT + ".")


PRODUCTION = sorted(name for name in all_modules() if not is_kit_or_demo(name))


def imports_of(source: str, module: str, *, is_package: bool) -> list[tuple[str, int, bool]]:
    """(imported module, line, inside a function) for every import statement in ``source``.

    ``from a import b`` counts as importing ``a.b`` as well as ``a`` (``b`` may be a module).
    """
    package = module if is_package else module.rpartition(".")[0]
    found: list[tuple[str, int, bool]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            nested = in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
            if isinstance(child, ast.Import):
                found.extend((alias.name, child.lineno, in_function) for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    anchor = package.split(".")
                    anchor = anchor[: len(anchor) - (child.level - 1)]
                    base = ".".join([*anchor, *([base] if base else [])])
                found.append((base, child.lineno, in_function))
                found.extend((f"{base}.{a.name}", child.lineno, in_function) for a in child.names)
            visit(child, nested)

    visit(ast.parse(source), False)
    return found


def violations(module: str, source: str, *, is_package: bool = False) -> list[str]:
    """What is wrong with ``module``'s imports under the rule above (one problem per
    statement; ``from substrate_gpu.testing import demo`` imports the demo, which lives in
    the kit, and is judged by the demo's rule)."""
    statements: dict[int, tuple[list[str], bool]] = {}
    for name, line, in_function in imports_of(source, module, is_package=is_package):
        statements.setdefault(line, ([], in_function))[0].append(name)
    problems = []
    for line, (names, in_function) in statements.items():
        if DEMO in names:
            if not (module in DEMO_ENTRY_POINTS and in_function):
                problems.append(
                    f"{module}:{line} imports the demo"
                    + ("" if module in DEMO_ENTRY_POINTS else " (not a demo entry point)")
                    + ("" if in_function else " at module level")
                )
        elif kit := next((n for n in names if n == KIT or n.startswith(KIT + ".")), None):
            problems.append(f"{module}:{line} imports the test kit ({kit})")
    return problems


@pytest.mark.parametrize("module", PRODUCTION)
def test_production_module_imports_neither_the_test_kit_nor_the_demo(module):
    """No import statement in a production module names substrate_gpu.testing (or the demo)."""
    path = all_modules()[module]
    assert violations(module, path.read_text(), is_package=path.name == "__init__.py") == []


def test_importing_every_production_module_loads_no_kit_module():
    """In a fresh interpreter, importing all production modules leaves the kit unloaded."""
    importable = [m for m in PRODUCTION if not m.endswith(".__main__")]  # __main__ runs the CLI
    script = (
        "import importlib, json, sys\n"
        f"for name in {importable!r}:\n"
        "    importlib.import_module(name)\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('substrate_gpu'))))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    ).stdout
    loaded = json.loads(out)
    assert "substrate_gpu.cli" in loaded  # the walk really imported the package
    assert [m for m in loaded if is_kit_or_demo(m)] == []


@pytest.mark.parametrize(
    ("module", "source", "expected"),
    [
        pytest.param(
            "substrate_gpu.cdi.parse",
            "from substrate_gpu.testing import node",
            ["substrate_gpu.cdi.parse:1 imports the test kit (substrate_gpu.testing)"],
            id="from-kit",
        ),
        pytest.param(
            "substrate_gpu.cdi.parse",
            "from substrate_gpu import testing",
            ["substrate_gpu.cdi.parse:1 imports the test kit (substrate_gpu.testing)"],
            id="from-package-import-kit",
        ),
        pytest.param(
            "substrate_gpu.lifecycle.agent",
            "def f():\n    import substrate_gpu.testing.runsc",
            ["substrate_gpu.lifecycle.agent:2 imports the test kit (substrate_gpu.testing.runsc)"],
            id="lazy-kit",
        ),
        pytest.param(
            "substrate_gpu.cdi.parse",
            "from ..testing import node",
            ["substrate_gpu.cdi.parse:1 imports the test kit (substrate_gpu.testing)"],
            id="relative-kit",
        ),
        pytest.param(
            "substrate_gpu.cli._demo",
            "from substrate_gpu.testing import demo",
            ["substrate_gpu.cli._demo:1 imports the demo at module level"],
            id="demo-at-module-level",
        ),
        pytest.param(
            "substrate_gpu.cli._inject",
            "def f():\n    from substrate_gpu.testing import demo",
            ["substrate_gpu.cli._inject:2 imports the demo (not a demo entry point)"],
            id="demo-elsewhere",
        ),
        pytest.param(
            "substrate_gpu.cli._agent",
            "def f():\n    from substrate_gpu.testing import demo",
            [],
            id="demo-lazily-from-entry-point",
        ),
        pytest.param(
            "substrate_gpu.cdi.parse",
            "from substrate_gpu import testing_tools",
            [],
            id="similar-name",
        ),
    ],
)
def test_the_walk_finds_every_form_of_import(module, source, expected):
    """The static check sees absolute, relative and function-local imports of the kit."""
    assert violations(module, source) == expected
