"""Each command loads only what it needs: ``import substrate_gpu.cli`` alone loads no agent stack.

The figures are tests/bench/bench_cli.py's; these tests keep the imports that decide them.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from eventlog import logs

#: What the agent, controller and demo need, and no everyday command.
AGENT_STACK = (
    "prometheus_client",
    "anyio",
    "substrate_gpu.lifecycle",
    "kopf",
    "grpc",
    "google.protobuf",
)

#: The agent's own layers and libraries, which no one-shot command loads.
AGENT_ONLY = (
    "prometheus_client",
    "anyio",
    "kopf",
    "structlog",
    "substrate_gpu.service",
    "substrate_gpu.observability",
    "substrate_gpu.lifecycle.agent",
    "substrate_gpu.lifecycle.effects",
    "substrate_gpu.lifecycle.pipeline",
    "substrate_gpu.eventlog.writer",
    "substrate_gpu.eventlog.recovery",
    "substrate_gpu.runsc",
)

#: A CDI spec with one GPU whose nodes are /dev/null (tests/bench/bench_cli.py's).
SPEC = {
    "cdiVersion": "0.5.0",
    "kind": "nvidia.com/gpu",
    "devices": [
        {
            "name": "all",
            "containerEdits": {
                "deviceNodes": [{"path": "/dev/nvidia0", "hostPath": "/dev/null", "major": 195}]
            },
        }
    ],
    "containerEdits": {"env": ["NVIDIA_VISIBLE_DEVICES=void"]},
}
CONFIG = {
    "ociVersion": "1.0.2",
    "root": {"path": "rootfs"},
    "process": {"args": ["sh"], "cwd": "/", "env": ["PATH=/bin"]},
    "linux": {},
}


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


def _run_quietly(argv: list[str]) -> str:
    """Code for :func:`_loaded_after`: ``cli.main(argv)``, its output swallowed, exit 0."""
    return (
        "import contextlib, io\nfrom substrate_gpu import cli\n"
        "with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):"
        f" code = cli.main({argv!r})\n"
        "assert code == 0, code"
    )


@pytest.fixture
def spec_file(tmp_path: Path) -> Path:
    path = tmp_path / "nvidia.json"
    path.write_text(json.dumps(SPEC))
    return path


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    path = tmp_path / "bundle"
    (path / "rootfs").mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(CONFIG))
    return path


@pytest.fixture
def small_log(tmp_path: Path) -> Path:
    """An event log of two registered actors."""
    return logs.write_lines(
        tmp_path / "events.jsonl", logs.header(), logs.registered("a0", 1), logs.registered("a1", 2)
    )


def test_cdi_show_loads_neither_the_agent_nor_the_injector(spec_file: Path) -> None:
    """``cdi show`` of a JSON spec parses and plans: no lifecycle, event log, service,
    logging, bundle I/O or YAML."""
    loaded = _loaded_after(_run_quietly(["cdi", "show", str(spec_file)]))
    unwanted = (
        *AGENT_ONLY,
        "substrate_gpu.lifecycle",
        "substrate_gpu.eventlog",
        "substrate_gpu.injection.bundle",
        "substrate_gpu.rootfs",
        "msgspec",
        "elftools",
        "yaml",  # the spec is JSON
    )
    assert sorted(m for m in unwanted if m in loaded) == []


def test_inject_loads_no_agent_and_no_logging_when_it_logs_nothing(
    spec_file: Path, bundle: Path
) -> None:
    """``inject`` at the default level logs nothing, so structlog is never imported; a JSON
    spec without libraries needs neither PyYAML nor pyelftools, and config.json goes through
    the standard library's json (msgspec's import was ~16 ms of the command)."""
    argv = ["inject", "--bundle", str(bundle), "--cdi-spec", str(spec_file)]
    loaded = _loaded_after(_run_quietly(argv))
    unwanted = (
        *AGENT_ONLY,
        "substrate_gpu.lifecycle",
        "substrate_gpu.eventlog",
        "elftools",
        "yaml",
        "msgspec",
    )
    assert sorted(m for m in unwanted if m in loaded) == []
    assert "substrate_gpu.injection.bundle" in loaded  # it did inject


def test_replay_loads_the_machine_but_not_the_agent(small_log: Path) -> None:
    """``replay`` needs the events and the machine, not the agent, its effects or runsc; the
    machine comes from its compiled form (no PyYAML), and transitions' reference Machine is
    never built."""
    loaded = _loaded_after(_run_quietly(["replay", str(small_log)]))
    assert sorted(m for m in (*AGENT_ONLY, "yaml", "transitions") if m in loaded) == []
    assert "substrate_gpu.lifecycle.machine" in loaded


def test_a_one_shot_command_that_logs_is_configured_when_it_logs(
    spec_file: Path, bundle: Path
) -> None:
    """At ``--log-level INFO`` the injection's own record comes out as a JSON line on stderr
    (logging was configured at that first record), and stdout keeps only the report."""
    inject = ["inject", "--bundle", str(bundle), "--cdi-spec", str(spec_file)]
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "substrate_gpu",
            "--log-format",
            "json",
            "--log-level",
            "INFO",
            *inject,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    records = [json.loads(line) for line in done.stderr.splitlines()]
    assert [(r["event"], r["level"], r["logger"]) for r in records] == [
        ("gpu_injected", "info", "substrate_gpu.injection.bundle")
    ]
    assert records[0]["bundle"] == str(bundle)
    assert done.stdout.startswith(f"injected: {bundle}")
