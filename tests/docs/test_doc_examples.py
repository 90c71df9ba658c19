"""The docs' runnable examples, run as written: a doc whose example stops working fails here.

An example sits between ``<!-- example: NAME -->`` and ``<!-- /example -->`` in a doc, around
one fenced block. A ``console`` block is a transcript: each ``$ command`` (a trailing ``\\``
continues it) runs in bash with the virtual environment's ``bin`` first on ``PATH`` (a plain
``substrate-gpu …`` command, without shell syntax, through the CLI's ``main`` in this
process: the same code, without a second of imports per line), and what it prints (stdout,
then stderr) must equal the lines under it. A ``python`` block runs as written.
When a scenario log or an output format changes on purpose, update the doc's transcript. The only edit is the paths a doc names on a real node
(``/run/substrate-gpu``, ``/var/lib/substrate-gpu``), moved into a temporary directory.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from service.agentproc import REPO, AgentProcess
from support import gpu_specs
from support.real import missing

from substrate_gpu import cli, eventlog
from substrate_gpu.pools import validation
from substrate_gpu.testing.sandboxes import SimulatedSandboxes

DOCS = REPO / "docs"


def example(doc: str, name: str) -> tuple[str, str]:
    """The fenced block between the markers named ``name`` in ``docs/<doc>``: (language, body)."""
    text = (DOCS / doc).read_text(encoding="utf-8")
    found = re.search(
        rf"<!-- example: {re.escape(name)} -->\n```(\w+)\n(.*?)```\n<!-- /example -->",
        text,
        re.DOTALL,
    )
    assert found is not None, f"no example {name!r} between markers in docs/{doc}"
    return found[1], found[2]


def transcript(body: str) -> list[tuple[str, list[str]]]:
    """A console block's (command, expected output lines), in order."""
    steps: list[tuple[str, list[str]]] = []
    lines = iter(body.splitlines())
    for line in lines:
        if line.startswith("$ "):
            command = line[2:]
            while command.endswith("\\"):
                command = command[:-1] + next(lines).strip()
            steps.append((command, []))
        else:
            assert steps, f"output before any command: {line!r}"
            steps[-1][1].append(line)
    return steps


class Node:
    """The doc's node paths, moved under a temporary directory."""

    def __init__(self, tmp: Path) -> None:
        self.moves = {
            "/run/substrate-gpu": str(tmp / "run" / "substrate-gpu"),
            "/var/lib/substrate-gpu": str(tmp / "lib" / "substrate-gpu"),
        }

    def __call__(self, text: str) -> str:
        for doc_path, here in self.moves.items():
            text = text.replace(doc_path, here)
        return text


#: Shell syntax that needs bash (a pipe, a variable, a redirection, a list of commands).
SHELL_SYNTAX = re.compile(r"[|&;<>$`]")


def _in_process(argv: list[str], cwd: Path) -> list[str]:
    """``substrate-gpu ARGV`` in ``cwd`` through the CLI's own ``main``: what it printed
    (out, then err).

    A plain command needs no shell, and a process each would cost the suite a second of
    imports; anything with shell syntax runs in bash."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.chdir(cwd), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        cli.main(argv)
    return out.getvalue().splitlines() + err.getvalue().splitlines()


def run_console(body: str, node: Node, cwd: Path = REPO) -> None:
    """Run a transcript in ``cwd``; every command's output must be the lines the doc shows."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    for command, expected in transcript(body):
        argv = shlex.split(node(command))
        if argv[0] == "substrate-gpu" and not SHELL_SYNTAX.search(command):
            printed = _in_process(argv[1:], cwd)
        else:
            done = subprocess.run(
                ["bash", "-o", "pipefail", "-c", node(command)],
                capture_output=True,
                text=True,
                cwd=cwd,
                env=env,
                timeout=60,
                check=False,
            )
            printed = done.stdout.splitlines() + done.stderr.splitlines()
        assert printed == [node(line) for line in expected], f"$ {command}"


@pytest.fixture
def agent_as_documented(tmp_path: Path):  # type: ignore[no-untyped-def]
    """The agent started with agent.md's opening command (paths moved, metrics off)."""
    node = Node(tmp_path)
    language, body = example("agent.md", "agent")
    assert language == "sh"
    argv = shlex.split(node(body).replace("\\\n", " "))
    assert argv[:2] == ["substrate-gpu", "agent"], argv
    agent = AgentProcess(tmp_path, *argv[2:], "--metrics-port", "0")
    agent.socket = Path(argv[argv.index("--socket") + 1])
    agent.wait_for_socket()
    yield node
    assert agent.terminate() == 0


def test_talking_to_the_agent_runs_as_written(agent_as_documented: Node) -> None:
    """agent.md's client transcript, Python example and socat example, in the doc's order."""
    if shutil.which("socat") is None:
        missing("socat")
    node = agent_as_documented
    run_console(example("agent.md", "client")[1], node)
    language, code = example("agent.md", "python")
    assert language == "python"
    done = subprocess.run(
        [sys.executable, "-c", node(code)], capture_output=True, text=True, timeout=30, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["bundle_prepared"]
    run_console(example("agent.md", "socat")[1], node)


def test_replay_example_prints_what_the_doc_shows() -> None:
    """event-log.md's ``substrate-gpu replay … --actor gpu-1`` prints exactly its transcript."""
    language, body = example("event-log.md", "replay")
    assert language == "console"
    run_console(body, Node(REPO))


def test_injecting_on_a_simulated_node_runs_as_written(runc_path: str, tmp_path: Path) -> None:
    """gpu-injection.md's simulated node, bundle and ``inject --generate``, from an empty dir."""
    language, body = example("gpu-injection.md", "simulated-inject")
    assert language == "console"
    run_console(body, Node(tmp_path), cwd=tmp_path)


def test_metrics_example_prints_what_its_last_comment_says() -> None:
    """observability.md's registry, AgentMetrics and MetricsServer example, run as written."""
    language, code = example("observability.md", "metrics")
    assert language == "python"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "docs/observability.md", "exec"), {})
    assert out.getvalue().splitlines() == [code.rstrip().splitlines()[-1].removeprefix("# ")]


@pytest.mark.anyio
async def test_event_log_serve_example_creates_then_resumes_a_log(tmp_path: Path) -> None:
    """event-log.md's ``serve``: a first run creates the log, a second recovers and resumes it."""
    language, code = example("event-log.md", "serve")
    assert language == "python"
    namespace: dict[str, Any] = {}
    exec(compile(code, "docs/event-log.md", "exec"), namespace)
    sandboxes = SimulatedSandboxes()  # an in-process runsc and CUDA probe (the test kit)
    log = tmp_path / "events.jsonl"
    await namespace["serve"](log, sandboxes, sandboxes, None, tmp_path / "checkpoints")
    assert eventlog.read_log(log).records == []
    await namespace["serve"](log, sandboxes, sandboxes, None, tmp_path / "checkpoints")


def _documented_pools() -> list[str]:
    """api-guide.md's WorkerPool YAML blocks that are whole documents (not spec fragments)."""
    text = (DOCS / "api-guide.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```yaml\n(.*?)```", text, re.DOTALL)
    return [block for block in blocks if "kind: WorkerPool" in block]


def test_api_guide_has_whole_pools_to_check() -> None:
    """The user's form, every option, and the upstream form are found (three at least)."""
    assert len(_documented_pools()) >= 3


@pytest.mark.parametrize(
    "pool", _documented_pools(), ids=lambda pool: re.findall(r"name: ([\w-]+)", pool)[0]
)
def test_every_whole_pool_in_the_api_guide_validates(pool: str) -> None:
    """A pool the guide shows is accepted as written (no errors; warnings allowed)."""
    report = validation.validate_document(yaml.safe_load(pool))
    assert report.errors == ()


def test_named_devices_example_prints_what_its_comments_say(tmp_path: Path) -> None:
    """gpu-injection.md's named-device example, on a four-GPU spec (node paths moved)."""
    language, code = example("gpu-injection.md", "named-devices")
    assert language == "python"
    spec = tmp_path / "nvidia.json"
    spec.write_text(json.dumps(gpu_specs.with_gpus(gpu_specs.load_raw(), 4)))
    moved = code.replace("/run/substrate/cdi/nvidia.json", str(spec))
    moved = moved.replace('"/etc/cdi"', repr(str(tmp_path / "etc")))
    moved = moved.replace('"/var/run/cdi"', repr(str(tmp_path / "run")))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(moved, "docs/gpu-injection.md", "exec"), {})
    expected = [line.removeprefix("# ") for line in code.rstrip().splitlines()[-2:]]
    assert out.getvalue().splitlines() == expected
