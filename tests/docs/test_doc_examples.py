"""The docs' runnable examples, run as written: a doc whose example stops working fails here.

An example sits between ``<!-- example: NAME -->`` and ``<!-- /example -->`` in a doc, around
one fenced block. A ``console`` block is a transcript: each ``$ command`` (a trailing ``\\``
continues it) runs in bash with the virtual environment's ``bin`` first on ``PATH`` (a plain
``substrate-gpu …`` command, without shell syntax, through the CLI's ``main`` in this
process: the same code, without a second of imports per line), and what it prints (stdout,
then stderr) must equal the lines under it. A ``python`` block runs as written (top-level ``await`` allowed, as in ``python -m asyncio``),
and every ``python`` block in docs/ must be such an example that a test here runs, or be
listed in :data:`NOT_RUN` with the reason.
When a scenario log or an output format changes on purpose, update the doc's transcript. The only edit is the paths a doc names on a real node
(``/run/substrate-gpu``, ``/var/lib/substrate-gpu``), moved into a temporary directory.
"""

from __future__ import annotations

import ast
import contextlib
import inspect
import io
import json
import logging
import os
import re
import shlex
import shutil
import subprocess
import sys
import typing
from pathlib import Path
from typing import Any

import anyio
import pytest
import structlog
import yaml
from cudackpt.sandbox import TOOL_IN_CONTAINER
from service.agentproc import REPO, AgentProcess
from support import gpu_specs, runc_bundle
from support.real import missing

from substrate_gpu import cdi, cli, eventlog, runsc
from substrate_gpu.lifecycle import effects, hooks
from substrate_gpu.observability.metrics import AgentMetrics
from substrate_gpu.observability.registry import AgentRegistry
from substrate_gpu.pools import validation
from substrate_gpu.testing import bundles, demo
from substrate_gpu.testing import node as node_
from substrate_gpu.testing.sandboxes import SimulatedSandboxes

DOCS = REPO / "docs"

#: The ``python`` examples no test runs, and why (none so far: add one only with a reason,
#: e.g. "needs a GPU").
NOT_RUN: dict[tuple[str, str], str] = {}


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


def python_blocks() -> list[tuple[str, str | None]]:
    """Every ``python`` block in docs/*.md: (doc, its example name, or None when unmarked)."""
    found: list[tuple[str, str | None]] = []
    for path in sorted(DOCS.glob("*.md")):
        text = path.read_text(encoding="utf-8")
        for block in re.finditer(r"^```python\n", text, re.MULTILINE):
            marker = re.search(r"<!-- example: ([\w-]+) -->\n\Z", text[: block.start()])
            found.append((path.name, marker[1] if marker else None))
    return found


def examples_run_here() -> set[tuple[str, str]]:
    """The (doc, name) of every ``example(...)`` call in the tests (an example that needs a
    fixture of another folder, such as the API server, is run there)."""
    found: set[tuple[str, str]] = set()
    for path in Path(__file__).parents[1].rglob("test_*.py"):
        source = path.read_text(encoding="utf-8")
        found |= set(re.findall(r'example\(\s*"([\w.-]+)",\s*"([\w-]+)"\s*\)', source))
    return found


def test_every_python_block_in_the_docs_is_run_or_listed_with_a_reason() -> None:
    """A new ``python`` block fails here until a test runs it (or NOT_RUN says why not)."""
    blocks = python_blocks()
    assert [b for b in blocks if b[1] is None] == [], "python blocks without example markers"
    named = {(doc, name) for doc, name in blocks if name is not None}
    assert sorted(named - examples_run_here() - NOT_RUN.keys()) == []
    assert sorted(NOT_RUN.keys() - named) == [], "NOT_RUN names examples that do not exist"
    assert sorted(NOT_RUN.keys() & examples_run_here()) == [], "listed as not run, yet run"


def moved(code: str, moves: dict[str, str]) -> str:
    """``code`` with the node paths it names moved (the only edit made to an example)."""
    for doc_path, here in moves.items():
        code = code.replace(doc_path, here)
    return code


async def run_python(code: str, doc: str, namespace: dict[str, Any]) -> str:
    """Run an example (top-level ``await`` allowed) in ``namespace``; what it printed (the
    package's log lines captured apart, whatever logging an earlier test configured)."""
    compiled = compile(code, f"docs/{doc}", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    out = io.StringIO()
    with contextlib.redirect_stdout(out), structlog.testing.capture_logs():
        result = eval(compiled, namespace)
        if inspect.iscoroutine(result):
            await result
    return out.getvalue()


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


@pytest.mark.anyio
async def test_cdi_parsing_example_runs_as_written(tmp_path: Path) -> None:
    """cdi-parsing.md's opening example, on a four-GPU spec (node paths moved)."""
    language, code = example("cdi-parsing.md", "parse")
    assert language == "python"
    spec = tmp_path / "nvidia.json"
    spec.write_text(json.dumps(gpu_specs.with_gpus(gpu_specs.load_raw(), 4)))
    code = moved(
        code,
        {
            "/run/substrate/cdi/nvidia.json": str(spec),
            '"/etc/cdi"': repr(str(tmp_path / "etc")),
            '"/var/run/cdi"': repr(str(tmp_path / "run")),
        },
    )
    namespace: dict[str, Any] = {}
    await run_python(code, "cdi-parsing.md", namespace)
    nodes = [node.path for node in namespace["edits"].device_nodes]
    assert "/dev/nvidia2" in nodes
    assert not {"/dev/nvidia0", "/dev/nvidia1", "/dev/nvidia3"} & set(nodes)
    assert [gpu.index for gpu in namespace["gpus"]] == [0, 1, 2, 3]
    assert isinstance(namespace["spec"], cdi.Spec)


@pytest.mark.anyio
async def test_runsc_example_runs_as_written(runc_path: str, tmp_path: Path) -> None:
    """runsc.md's driver and probe example: the runsc stand-in over real runc, paths moved."""
    language, code = example("runsc.md", "drive")
    assert language == "python"
    for name in ("pause-a1", "a1"):
        bundles.make_bundle(tmp_path / "bundles" / name, ["sleep", "600"])
    root = tmp_path / "runsc-root"
    code = moved(
        code,
        {
            "/run/substrate/runsc": str(root),
            "/usr/local/bin/runsc": str(node_.install_runsc_standin(tmp_path / "bin")),
            "/run/bundles": str(tmp_path / "bundles"),
            "/ckpt": str(tmp_path / "ckpt"),
        },
    )
    namespace: dict[str, Any] = {}
    try:
        await run_python(code, "runsc.md", namespace)
        assert (tmp_path / "ckpt/a1/3/checkpoint.img").is_file()
        state = await namespace["runtime"].state("a1")
        assert state.status == "running"  # leave_running: the stand-in keeps it
    finally:
        runc_bundle.delete_all(root, runc=runc_path)


def _methods(cls: type) -> set[str]:
    """A Protocol's methods: its public functions, and ``__call__``."""
    return {
        name
        for name, value in vars(cls).items()
        if inspect.isfunction(value) and (name == "__call__" or not name.startswith("_"))
    }


def test_architecture_seams_are_the_lifecycle_protocols() -> None:
    """architecture.md's Protocols run as written and match the code's, method by method."""
    language, code = example("architecture.md", "seams")
    assert language == "python"
    namespace: dict[str, Any] = {}
    exec(compile(code, "docs/architecture.md", "exec"), namespace)
    real = {
        "GpuInjector": effects.GpuInjector,
        "EventRecorder": hooks.EventRecorder,
        "TransitionObserver": hooks.TransitionObserver,
        "LifecycleMetrics": hooks.LifecycleMetrics,
    }
    assert {name for name in namespace if name in real} == real.keys()
    for name, protocol in real.items():
        shown = namespace[name]
        methods = _methods(protocol)
        assert _methods(shown) == methods, name
        for method in methods:
            mine, theirs = getattr(shown, method), getattr(protocol, method)
            assert inspect.signature(mine).parameters.keys() == (
                inspect.signature(theirs).parameters.keys()
            ), f"{name}.{method}"
            assert [p.kind for p in inspect.signature(mine).parameters.values()] == [
                p.kind for p in inspect.signature(theirs).parameters.values()
            ], f"{name}.{method}"
            assert typing.get_type_hints(mine) == typing.get_type_hints(theirs), f"{name}.{method}"
            assert inspect.iscoroutinefunction(mine) == inspect.iscoroutinefunction(theirs)


def trailing_comments(code: str) -> list[str]:
    """The ``# …`` lines that end an example: what it prints."""
    lines = code.rstrip().splitlines()
    tail: list[str] = []
    while lines and lines[-1].startswith("# "):
        tail.insert(0, lines.pop().removeprefix("# "))
    return tail


@pytest.mark.anyio
async def test_embedding_example_prints_what_its_last_comment_says(
    runc_path: str, tmp_path: Path
) -> None:
    """architecture.md's embedding example, on a simulated node (the runsc stand-in, real
    runc, the real injector and fd probe), with an event log and metrics."""
    language, code = example("architecture.md", "embedding")
    assert language == "python"
    node = demo.build_demo_node(tmp_path / "node")
    demo.actor_bundle(tmp_path / "b" / "a1", holds_gpu=False)
    code = moved(
        code,
        {
            "/var/lib/substrate/checkpoints": str(tmp_path / "checkpoints"),
            '"/b/a1"': repr(str(tmp_path / "b" / "a1")),
        },
    )
    registry = AgentRegistry()
    try:
        async with await eventlog.EventLog.open(tmp_path / "events.jsonl") as event_log:
            namespace: dict[str, Any] = {
                "driver": node.components.runtime,
                "probe": node.components.probe,
                "inject": node.components.injector,
                "event_log": event_log,
                "metrics": AgentMetrics(registry),
            }
            printed = await run_python(code, "architecture.md", namespace)
    finally:
        demo.cleanup_containers(tmp_path / "node")
    assert printed.splitlines() == trailing_comments(code)
    assert [r.type for r in eventlog.read_log(tmp_path / "events.jsonl").records][:3] == [
        "actor_registered",
        "bundle_prepared",
        "run_requested",
    ]


@pytest.mark.anyio
async def test_embed_config_example_prints_what_its_last_comment_says(
    runc_path: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """python-api.md's embedding from an AgentConfig: the production wiring, on a simulated
    node (its driver root, toolkit, device root and the runsc stand-in over real runc in
    place of the paths the doc names; the node paths moved under a temporary directory)."""
    language, code = example("python-api.md", "embed-config")
    assert language == "python"
    sim = node_.build_node(tmp_path / "node", gpus=(0,), openable_devices=True)
    standin = node_.install_runsc_standin(sim.toolkit_dir)
    monkeypatch.setenv("NVIDIA_CTK_STANDIN_SYSTEM_ROOT", str(sim.root))  # the stand-in's knob
    node = Node(tmp_path)
    code = node(
        moved(
            code,
            {  # in this order: the runsc stand-in lies in the toolkit's directory
                "/opt/nvidia-toolkit": str(sim.toolkit_dir),
                "/usr/local/nvidia": str(sim.driver_root),
                "/usr/local/bin/runsc": str(standin),
                'Path("/")': f"Path({str(sim.root)!r})",
            },
        )
    )
    demo.actor_bundle(Path(node("/run/substrate-gpu/bundles/a1")), holds_gpu=False)
    runsc_root = Path(node("/run/substrate-gpu/runsc"))
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        printed = await run_python(code, "python-api.md", {})
    finally:
        for handler in [h for h in root.handlers if h not in handlers]:  # configure_logging's
            root.removeHandler(handler)
        root.setLevel(level)
        structlog.reset_defaults()
        if runsc_root.is_dir():  # a failed run's container (the example deletes its own)
            for entry in runsc_root.iterdir():
                subprocess.run(
                    [runc_path, "--root", str(runsc_root), "delete", "--force", entry.name],
                    capture_output=True,
                    check=False,
                )
    assert printed.splitlines() == trailing_comments(code)
    logged = [
        r.type for r in eventlog.read_log(Path(node("/var/lib/substrate-gpu/events.jsonl"))).records
    ]
    assert logged[:3] == ["actor_registered", "bundle_prepared", "run_requested"]
    assert logged[-1] == "deleted"


@pytest.mark.anyio
async def test_worker_client_example_prints_what_its_last_comment_says(tmp_path: Path) -> None:
    """worker-api.md's Python client, against a real agent serving the worker socket (its
    path moved)."""
    from service.workerclient import connect

    language, code = example("worker-api.md", "worker-client")
    assert language == "python"
    socket = tmp_path / "worker" / "worker.sock"
    code = moved(code, {"/var/lib/ate/workers/POD_UID/worker.sock": str(socket)})
    agent = AgentProcess.on_socket(tmp_path, "--worker-socket", str(socket), "--atelet-socket", "")
    try:
        connect(socket)
        printed = await run_python(code, "worker-api.md", {})
    finally:
        agent.terminate()
    assert printed.splitlines() == trailing_comments(code)


@pytest.mark.anyio
async def test_gpu_settings_example_prints_what_its_last_comment_says(
    runc_path: str, tmp_path: Path
) -> None:
    """api-guide.md's GpuSettings example, on a simulated node (its driver root moved)."""
    language, code = example("api-guide.md", "gpu-settings")
    assert language == "python"
    node = demo.build_demo_node(tmp_path / "node")
    code = moved(code, {"/usr/local/nvidia": str(node.node.driver_root)})
    namespace: dict[str, Any] = {
        "runsc_driver": node.components.runtime,
        "probe": node.components.probe,
        "inject": node.components.injector,
        "checkpoints": tmp_path / "checkpoints",
    }
    printed = await run_python(code, "api-guide.md", namespace)
    assert printed.splitlines() == trailing_comments(code)
    gpu = namespace["gpu"]
    assert gpu.driver_root == node.node.driver_root
    assert gpu.host_facts().driver_version == node.node.driver_version


@pytest.mark.anyio
async def test_gpu_suspend_exec_route_example_runs_as_written(
    runtime: runsc.RunscDriver, make_gpu_bundle: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """gpu-suspend.md's exec route: the cuda-checkpoint stand-in inside a real runc container
    (two processes holding /dev/nvidia0), driven through the runsc stand-in's ``exec``, whose
    runsc lacks ``--cuda-checkpoint-path`` (else runsc's own route is chosen)."""
    language, code = example("gpu-suspend.md", "exec-route")
    assert language == "python"
    monkeypatch.setenv("RUNSC_STANDIN_FEATURES", "leave-running,nvproxy-list")
    bundle, state = make_gpu_bundle()
    await runtime.create("a1", bundle, nvproxy=True)
    await runtime.start("a1")
    with anyio.fail_after(5):
        while not (state / "child.pid").is_file() or not (state / "child.pid").read_text():
            await anyio.sleep(0.02)
    code = moved(code, {"/usr/local/bin/cuda-checkpoint": TOOL_IN_CONTAINER})
    namespace: dict[str, Any] = {"runtime": runtime}
    await run_python(code, "gpu-suspend.md", namespace)
    assert namespace["route"].name == "exec-cuda-checkpoint"
    assert namespace["outcome"].suspended, namespace["outcome"].reason
    assert [await namespace["tool"].get_state(pid) for pid in namespace["pids"]] == [
        "checkpointed"
    ] * 2


@pytest.mark.anyio
async def test_gpu_suspend_preflight_example_runs_as_written(
    runtime: runsc.RunscDriver, tmp_path: Path
) -> None:
    """gpu-suspend.md's driver preflight, on a simulated node's driver root: the runsc
    stand-in lists its driver, so the facts come back."""
    language, code = example("gpu-suspend.md", "preflight")
    assert language == "python"
    node = node_.build_node(tmp_path / "node")
    namespace: dict[str, Any] = {"runtime": runtime}
    code = moved(code, {"/usr/local/nvidia": str(node.driver_root)})
    await run_python(code, "gpu-suspend.md", namespace)
    assert namespace["facts"].driver_version == node.driver_version
