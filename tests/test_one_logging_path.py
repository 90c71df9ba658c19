"""One logging path: the package logs through structlog only.

:mod:`substrate_gpu.observability.logging` is the one module that configures the standard
library (the handler every structlog and foreign record goes through). Anywhere else a
``logging.getLogger(...)`` or a ``logging.info(...)``-style call would bypass the bound
context (``actor_id``, ``event_type``) and the shared processors. The one exception is
turning a third-party library's stdlib logger down (``transitions`` logs every trigger at
INFO, brief §8): ``logging.getLogger("<library>").setLevel(...)``.

:mod:`substrate_gpu._log` is the other: every module takes its logger from its
``get_logger`` (never ``structlog.get_logger``), which, while structlog is unconfigured,
hands records to the package's stdlib loggers under a ``NullHandler`` instead of structlog's
default of printing to stdout (a library writes nothing until configured).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE_DIR = Path(__file__).resolve().parents[1] / "substrate_gpu"
CONFIG_MODULE = PACKAGE_DIR / "observability" / "logging.py"
#: Third-party stdlib loggers a module may turn down (never log through).
QUIETED_LIBRARIES = frozenset({"transitions"})
LOGGING_CALLS = frozenset(
    {"debug", "info", "warning", "warn", "error", "exception", "critical", "log", "basicConfig"}
)


def stray_logging(source: str) -> list[str]:
    """Every use of stdlib logging in ``source`` outside the allowed quieting, by line."""
    tree = ast.parse(source)
    allowed: set[int] = set()
    for node in ast.walk(tree):
        # logging.getLogger("transitions").setLevel(...)
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "setLevel"
            and isinstance(node.func.value, ast.Call)
            and _is_logging_attr(node.func.value.func, "getLogger")
            and [a.value for a in node.func.value.args if isinstance(a, ast.Constant)]
            in ([name] for name in QUIETED_LIBRARIES)
        ):
            allowed.add(id(node.func.value))
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or id(node) in allowed:
            continue
        func = node.func
        if _is_logging_attr(func, "getLogger") or any(
            _is_logging_attr(func, name) for name in LOGGING_CALLS
        ):
            assert isinstance(func, ast.Attribute)
            found.append(f"line {node.lineno}: logging.{func.attr}(...)")
        elif isinstance(func, ast.Name) and func.id == "getLogger":
            found.append(f"line {node.lineno}: getLogger(...)")
    return found


def _is_logging_attr(func: ast.expr, name: str) -> bool:
    return (
        isinstance(func, ast.Attribute)
        and func.attr == name
        and isinstance(func.value, ast.Name)
        and func.value.id == "logging"
    )


ROUTING_MODULE = PACKAGE_DIR / "_log.py"
MODULES = sorted(p for p in PACKAGE_DIR.rglob("*.py") if p not in {CONFIG_MODULE, ROUTING_MODULE})


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE_DIR)))
def test_module_takes_its_logger_from_the_package(path):
    """``_log.get_logger``, not ``structlog.get_logger``: unconfigured, structlog's own prints
    to stdout."""
    tree = ast.parse(path.read_text())
    direct = [
        f"line {node.lineno}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and node.attr in {"get_logger", "getLogger"}
        and isinstance(node.value, ast.Name)
        and node.value.id == "structlog"
    ]
    assert direct == []


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE_DIR)))
def test_module_logs_through_structlog_only(path):
    """No stdlib logger is created or logged through outside observability/logging.py."""
    assert stray_logging(path.read_text()) == []


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        pytest.param(
            "import logging\n_log = logging.getLogger(__name__)",
            ["line 2: logging.getLogger(...)"],
            id="module-logger",
        ),
        pytest.param(
            "import logging\nlogging.warning('x')",
            ["line 2: logging.warning(...)"],
            id="root-logger-call",
        ),
        pytest.param(
            "from logging import getLogger\nlog = getLogger('a')",
            ["line 2: getLogger(...)"],
            id="imported-name",
        ),
        pytest.param(
            "import logging\nlogging.getLogger('substrate_gpu').setLevel(10)",
            ["line 2: logging.getLogger(...)"],
            id="own-logger-level",
        ),
        pytest.param(
            "import logging\nlogging.getLogger('transitions').setLevel(logging.WARNING)",
            [],
            id="quieting-a-library",
        ),
        pytest.param(
            "import structlog\nlog = structlog.get_logger(__name__)\nlog.warning('x', a=1)",
            [],
            id="structlog",
        ),
    ],
)
def test_the_check_finds_stray_stdlib_logging(source, expected):
    """The check flags stdlib loggers and root-logger calls, and allows quieting a library."""
    assert stray_logging(source) == expected
