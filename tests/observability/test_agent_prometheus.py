"""A real Prometheus scrapes the real agent process while a scenario runs through its socket.

The agent (``python -m substrate_gpu agent``) drives the runsc driver against the packaged
runsc stand-in over real runc. The scenario: a CPU actor runs, a suspend is refused while a
CUDA context is observed live, accepted once it closes; a second actor stays registered; one
malformed line is refused. Prometheus (the project's ``metrics/prometheus.yml`` and rules,
target rewritten, 1 s interval) must then hold those numbers, and ``promtool check metrics``
must find nothing to lint in a live scrape.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
from service.agentproc import AgentProcess, event, register
from support import runc_bundle

from substrate_gpu.testing import bundles
from substrate_gpu.testing import node as node_

from .prometheus_server import free_port, running_prometheus
from .scrape import fetch, value

pytestmark = pytest.mark.runc

DEADLINE_S = 15.0


def _wait_for_metric(url: str, name: str, expected: float, **labels: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while True:
        _, text = fetch(url)
        if value(text, name, **labels) == expected:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"{name}{labels} never reached {expected}:\n{text}")
        time.sleep(0.1)


@pytest.fixture
def agent(tmp_path: Path, runc_path: str):
    """The agent process on the runsc stand-in over real runc, metrics on a free port."""
    runsc = node_.install_runsc_standin(tmp_path / "bin")
    port = free_port()
    process = AgentProcess.on_socket(
        tmp_path,
        "--metrics-port",
        str(port),
        "--runsc",
        str(runsc),
        env={"RUNSC_STANDIN_RUNC": runc_path},
    )
    process.metrics_url = f"http://127.0.0.1:{port}/metrics"
    yield process
    try:
        assert process.terminate() == 0, process.stderr()
    finally:
        runc_bundle.delete_all(tmp_path / "runsc-root", runc=runc_path)


@pytest.fixture
def prometheus(prometheus_binary: str, agent, tmp_path: Path):
    with running_prometheus(prometheus_binary, agent.metrics_url.split("/")[2], tmp_path) as api:
        yield api


def _scenario(agent, bundle: Path) -> None:
    """Drive the actors through the socket, waiting on the agent's own metrics."""
    url = agent.metrics_url
    with agent.client() as client:
        for request in [
            register("worker", bundle=str(bundle)),
            event("bundle_prepared", "worker", bundle=str(bundle)),
            event("run_requested", "worker"),
            register("waiting"),
        ]:
            assert client.request(request)["ok"]
        _wait_for_metric(url, "substrate_gpu_actors", 1, state="running")

        assert client.request(event("cuda_context_opened", "worker", pid=7))["ok"]
        refused = client.request(event("suspend_requested", "worker"))
        assert (refused["ok"], refused["state"]) == (True, "running")
        assert "live CUDA context" in refused["reason"]

        assert client.request(event("cuda_context_closed", "worker", pid=7))["ok"]
        accepted = client.request(event("suspend_requested", "worker"))
        assert (accepted["ok"], accepted["state"]) == (True, "checkpointing")
        _wait_for_metric(url, "substrate_gpu_actors", 1, state="suspended")

        malformed = client.request(b"this is not an event")
        assert malformed["ok"] is False


def test_prometheus_scrapes_the_agent_through_a_scenario(agent, prometheus, tmp_path, promtool):
    """Actors by state, transitions and the refusal reach a real Prometheus; the scrape lints clean."""
    bundle = bundles.make_bundle(tmp_path / "bundle", ["sh", "-c", "while true; do sleep 1; done"])
    _scenario(agent, bundle)

    def scalar(expr: str) -> str:
        (sample,) = prometheus.wait_for(expr)
        assert sample["metric"].get("job", "substrate-gpu-agent") == "substrate-gpu-agent"
        return str(sample["value"][1])

    assert scalar('substrate_gpu_actors{state="suspended"} == 1') == "1"
    assert scalar('substrate_gpu_actors{state="registered"} == 1') == "1"
    assert scalar('substrate_gpu_actors{state="running"} == 0') == "0"
    transitions = (
        'substrate_gpu_actor_transitions_total{{from="{0}",to="{1}",trigger="{2}"}} == {3}'
    )
    assert scalar(transitions.format("starting", "running", "sandbox_started", 1)) == "1"
    assert scalar(transitions.format("running", "running", "suspend_requested", 1)) == "1"
    assert scalar(transitions.format("running", "checkpointing", "suspend_requested", 1)) == "1"
    assert scalar(transitions.format("checkpointing", "suspended", "checkpoint_written", 1)) == "1"
    assert scalar('substrate_gpu_checkpoint_refusals_total{reason="live_cuda_context"} == 1') == "1"
    assert scalar('substrate_gpu_events_rejected_total{reason="malformed"} == 1') == "1"
    assert (
        scalar(
            'sum(substrate_gpu_runtime_operation_duration_seconds_count{effect="runsc_checkpoint",outcome="ok"}) == 1'
        )
        == "1"
    )
    (up,) = prometheus.query('up{job="substrate-gpu-agent"}')
    assert up["value"][1] == "1"

    # No series is labelled with an actor id.
    series = prometheus.get("series", **{"match[]": '{__name__=~"substrate_gpu_.*"}'})
    assert not [s for s in series if any(v in {"worker", "waiting"} for v in s.values())]

    _, text = fetch(agent.metrics_url)
    lint = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True, check=False
    )
    assert lint.returncode == 0, lint.stdout + lint.stderr
    assert (lint.stdout + lint.stderr).strip() == ""
