"""Each command loads only what it needs: ``import substrate_gpu.cli`` alone loads no agent stack.

The figures are tests/bench/bench_cli.py's; these tests keep the imports that decide them.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

#: What the agent, controller and demo need, and no everyday command.
AGENT_STACK = ("prometheus_client", "anyio", "substrate_gpu.lifecycle", "kopf")


def _loaded_after(code: str) -> set[str]:
    """The modules loaded once ``code`` has run in a fresh interpreter."""
    done = subprocess.run(
        [sys.executable, "-c", f"{code}\nimport json, sys; print(json.dumps(sorted(sys.modules)))"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return set(json.loads(done.stdout.splitlines()[-1]))


def test_importing_the_cli_loads_no_agent_stack() -> None:
    """``import substrate_gpu.cli`` (every command's start) loads none of the agent's stack."""
    loaded = _loaded_after("import substrate_gpu.cli")
    assert sorted(m for m in AGENT_STACK if m in loaded) == []


def test_building_the_parser_loads_no_agent_stack() -> None:
    """Every subcommand's parser (``--help``) is built without the agent stack."""
    loaded = _loaded_after("from substrate_gpu import cli; cli.build_parser()")
    assert sorted(m for m in AGENT_STACK if m in loaded) == []
    assert "substrate_gpu.pools" not in loaded and "yaml" not in loaded


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param(["pool", "crd"], id="pool crd"),
        pytest.param(["client", "--socket", "/nonexistent/agent.sock", "actors"], id="client"),
    ],
)
def test_commands_that_never_log_start_without_structlog(argv: list[str]) -> None:
    """``pool`` and ``client`` log nothing, so structlog is never loaded for them."""
    loaded = _loaded_after(
        "import contextlib, io\nfrom substrate_gpu import cli\n"
        f"with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):"
        f" cli.main({argv!r})"
    )
    assert "structlog" not in loaded
    assert sorted(m for m in AGENT_STACK if m in loaded) == []


def test_the_agent_parser_still_has_its_flags() -> None:
    """``agent``'s arguments, added when it is typed, parse with their defaults."""
    from substrate_gpu import cli

    args = cli.build_parser().parse_args(["agent", "--stdin"])
    assert args.metrics_port == 9477 and args.max_clients >= 1 and args.stdin
