"""``substrate-gpu agent --worker-socket``: it registers with atelet, and hosts at most
``--max-actors``, against the real agent process.

The atelet is the test kit's (a real grpcio server over mutual TLS); what the report sends
and how it retries is pinned in tests/service/test_capacity_report.py.
"""

from __future__ import annotations

import time
from pathlib import Path

import anyio
import grpc
import pytest
from support import spiffe

from substrate_gpu.service.ateworker import ateworker_pb2 as pb
from substrate_gpu.testing import atelet as fake
from substrate_gpu.testing import node as node_

from .agentproc import AgentProcess, free_port, sample, scrape
from .workerclient import Actor, connect, status_of

REGISTRATION = "substrate_gpu_atelet_registration"


def _identity(tmp_path: Path) -> tuple[spiffe.Signer, spiffe.PodCertificate]:
    signer = spiffe.Signer()
    worker = signer.pod(spiffe.WORKER_SA, pod="gpu-pool-workers-abc12")
    identity = tmp_path / "identity"
    identity.mkdir()
    (identity / "credential-bundle.pem").write_bytes(worker.bundle())
    (identity / "trust-bundle.pem").write_bytes(signer.trust_bundle())
    capacity = tmp_path / "capacity"
    capacity.mkdir()
    (capacity / "cpu_milli").write_text("4000")
    (capacity / "memory_bytes").write_text("17179869184")
    return signer, worker


def _state(port: int) -> str:
    text = scrape(port)
    [state] = [
        s
        for s in ("off", "reporting", "registered", "stopped")
        if sample(text, REGISTRATION, state=s) == 1
    ]
    return state


def _wait_state(port: int, want: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while (state := _state(port)) != want:
        assert time.monotonic() < deadline, f"{REGISTRATION} stayed {state}, not {want}"
        time.sleep(0.05)


@pytest.mark.anyio
async def test_the_agent_serves_while_atelet_is_away_and_registers_when_it_comes(tmp_path):
    """atelet absent at start: the agent serves both doors, the report retries
    (``reporting``); atelet comes up: it receives ``--max-actors`` and the container's limits
    from the worker's certificate, and the state is ``registered``."""
    signer, worker = _identity(tmp_path)
    atelet_pod = signer.pod(spiffe.ATELET_SA, pod="atelet-x7k2q")
    support = tmp_path / "ate" / "worker-support.sock"
    port = free_port()
    agent = AgentProcess.on_socket(
        tmp_path,
        "--worker-socket", str(tmp_path / "worker" / "worker.sock"),
        "--atelet-socket", str(support),
        "--atunnel-credential-bundle", str(tmp_path / "identity" / "credential-bundle.pem"),
        "--atunnel-trust-bundle", str(tmp_path / "identity" / "trust-bundle.pem"),
        "--capacity-dir", str(tmp_path / "capacity"),
        "--max-actors", "3",
        "--metrics-port", str(port),
    )  # fmt: skip
    try:
        stub = connect(tmp_path / "worker" / "worker.sock")
        assert (
            list(stub.GetActiveWorkloadStats(pb.GetActiveWorkloadStatsRequest(), timeout=5).samples)
            == []
        )
        with agent.client() as client:
            assert client.request({"query": "actors"})["actors"] == []
        _wait_state(port, "reporting")
        async with fake.serving(
            support,
            certificate_chain=atelet_pod.chain_pem,
            private_key=atelet_pod.key_pem,
            client_ca=signer.trust_bundle(),
        ) as atelet:
            [call] = await atelet.wait_for(1, timeout=60)
            await anyio.to_thread.run_sync(_wait_state, port, "registered")
        assert call.request.capacity.actors == 3
        assert [(x.name, x.quantity) for x in call.request.capacity.resources.limits] == [
            ("cpu", "4"),
            ("memory", "16Gi"),
        ]
        assert call.peer_certificate == worker.chain_pem
        assert "registered worker capacity and hardware" in agent.stderr()
    finally:
        agent.terminate()


@pytest.mark.anyio
async def test_the_agent_serves_while_atelet_holds_its_report_unanswered(tmp_path):
    """atelet accepts the connection, reads the report and never answers: the attempt waits
    upstream's 10 s per call, during which the worker API, the JSON door and the metrics
    answer (``reporting``); then the agent closes that connection and tries again after the
    first backoff (0.5 s)."""
    signer, _ = _identity(tmp_path)
    atelet_pod = signer.pod(spiffe.ATELET_SA, pod="atelet-x7k2q")
    support = tmp_path / "ate" / "worker-support.sock"
    port = free_port()
    flags = (
        "--worker-socket", str(tmp_path / "worker" / "worker.sock"),
        "--atelet-socket", str(support),
        "--atunnel-credential-bundle", str(tmp_path / "identity" / "credential-bundle.pem"),
        "--atunnel-trust-bundle", str(tmp_path / "identity" / "trust-bundle.pem"),
        "--capacity-dir", str(tmp_path / "capacity"),
        "--metrics-port", str(port),
    )  # fmt: skip
    async with fake.silent(
        support,
        certificate_chain=atelet_pod.chain_pem,
        private_key=atelet_pod.key_pem,
        client_ca=signer.trust_bundle(),
    ) as atelet:
        agent = await anyio.to_thread.run_sync(lambda: AgentProcess.on_socket(tmp_path, *flags))
        try:
            [first] = await atelet.wait_for(1, timeout=60)

            def served() -> None:
                stub = connect(tmp_path / "worker" / "worker.sock")
                active = stub.GetActiveWorkloadStats(pb.GetActiveWorkloadStatsRequest(), timeout=5)
                assert list(active.samples) == []
                with agent.client() as client:
                    assert client.request({"query": "actors"})["actors"] == []
                assert _state(port) == "reporting"

            await anyio.to_thread.run_sync(served)
            assert first.closed_at is None, "the attempt ended before the agent was asked"
            await atelet.wait_closed(first, timeout=30)
            second = (await atelet.wait_for(2, timeout=30))[1]
        finally:
            await anyio.to_thread.run_sync(agent.terminate)
    assert first.path == "/atelet.WorkerSupport/RegisterWorker"  # the report was sent
    assert first.closed_at is not None
    assert 9.5 <= first.closed_at - first.accepted_at < 13
    assert second.accepted_at - first.closed_at >= 0.4
    assert "no answer within 10 s" in agent.stderr()


def test_an_agent_without_credentials_says_so_and_serves(tmp_path):
    """No Pod certificate (the defaults name none here): the report stops at once, said in
    the log and the metric, and the worker API still answers."""
    port = free_port()
    agent = AgentProcess.on_socket(
        tmp_path,
        "--worker-socket", str(tmp_path / "worker" / "worker.sock"),
        "--atelet-socket", str(tmp_path / "nowhere.sock"),
        "--atunnel-credential-bundle", str(tmp_path / "missing.pem"),
        "--metrics-port", str(port),
    )  # fmt: skip
    try:
        _wait_state(port, "stopped")
        stub = connect(tmp_path / "worker" / "worker.sock")
        assert (
            stub.GetActiveWorkloadStats(pb.GetActiveWorkloadStatsRequest(), timeout=5) is not None
        )
        assert "worker capacity report stopped" in agent.stderr()
        assert str(tmp_path / "missing.pem") in agent.stderr()
    finally:
        agent.terminate()


def test_no_report_without_the_worker_api_or_with_an_empty_atelet_socket(tmp_path):
    """The JSON door alone never reports; ``--atelet-socket ''`` turns the report off."""
    for name, extra in (
        ("json", ()),
        (
            "off",
            (
                "--worker-socket",
                str(tmp_path / "off" / "worker" / "worker.sock"),
                "--atelet-socket",
                "",
            ),
        ),
    ):
        port = free_port()
        (tmp_path / name).mkdir()
        agent = AgentProcess.on_socket(tmp_path / name, *extra, "--metrics-port", str(port))
        try:
            if extra:
                connect(tmp_path / "off" / "worker" / "worker.sock")
            assert _state(port) == "off"
            assert "capacity report" not in agent.stderr()
        finally:
            agent.terminate()


# --- --max-actors ---------------------------------------------------------------------------


@pytest.mark.runc
def test_a_run_beyond_max_actors_gets_upstreams_answer(tmp_path, runc_path):
    """With ``--max-actors 1`` and one actor running, a Run and a Restore of another UID are
    ``RESOURCE_EXHAUSTED`` "worker is full: 1 actors" and leave nothing registered; once the
    first is terminated, the slot is free again."""
    standin = node_.install_runsc_standin(tmp_path / "bin")
    agent = AgentProcess.on_socket(
        tmp_path,
        "--worker-socket", str(tmp_path / "worker" / "worker.sock"),
        "--runsc", str(standin),
        "--atelet-socket", "",
        "--max-actors", "1",
        env={"RUNSC_STANDIN_RUNC": runc_path},
    )  # fmt: skip
    try:
        worker = connect(tmp_path / "worker" / "worker.sock")
        first = Actor(tmp_path / "first", runsc=str(standin), uid="first").prepare()
        worker.RunWorkload(first.run(), timeout=120)
        second = Actor(tmp_path / "second", runsc=str(standin), uid="second").prepare()
        second.restore.mkdir(parents=True)
        (second.restore / "checkpoint.img").write_bytes(b"")
        for call, request in (
            (worker.RunWorkload, second.run()),
            (worker.RestoreWorkload, second.restore_request()),
        ):
            assert status_of(call, request, timeout=30) == (
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                "worker is full: 1 actors",
            )
        with agent.client() as client:
            listed = [a["actor_id"] for a in client.request({"query": "actors"})["actors"]]
        assert listed == ["first.1"]
        # The same UID again is not a new actor: it is refused as executing, not as full.
        assert (
            status_of(worker.RunWorkload, first.run(), timeout=30)[0]
            == grpc.StatusCode.FAILED_PRECONDITION
        )
        worker.TerminateWorkload(first.terminate(), timeout=120)
        worker.RunWorkload(second.prepare().run(), timeout=120)
        worker.TerminateWorkload(second.terminate(), timeout=120)
    finally:
        agent.terminate()


@pytest.mark.runc
def test_a_run_being_admitted_holds_its_slot(tmp_path, runc_path):
    """A Run whose ``runsc create`` hangs counts: a concurrent Run of another UID is full."""
    from .test_agent_health import kill_hung, wait_for_file

    standin = node_.install_runsc_standin(tmp_path / "bin")
    pids = tmp_path / "hang-pids"
    env = {
        "RUNSC_STANDIN_RUNC": runc_path,
        "RUNSC_STANDIN_HANG": "create",
        "RUNSC_STANDIN_HANG_PIDS": str(pids),
    }
    agent = AgentProcess.on_socket(
        tmp_path,
        "--worker-socket", str(tmp_path / "worker" / "worker.sock"),
        "--runsc", str(standin),
        "--atelet-socket", "",
        "--max-actors", "1",
        "--drain-timeout", "5",
        env=env,
    )  # fmt: skip
    try:
        worker = connect(tmp_path / "worker" / "worker.sock")
        booting = worker.RunWorkload.future(
            Actor(tmp_path / "a", runsc=str(standin), uid="a").prepare().run(), timeout=120
        )
        wait_for_file(pids)
        other = Actor(tmp_path / "b", runsc=str(standin), uid="b").prepare()
        assert status_of(worker.RunWorkload, other.run(), timeout=30) == (
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            "worker is full: 1 actors",
        )
        assert not booting.done()
    finally:
        kill_hung(pids)
        agent.terminate()


def test_max_actors_zero_refuses_every_run(tmp_path):
    """0 hosts nothing (upstream accepts 0): the first Run is full before anything runs."""
    agent = AgentProcess.on_socket(
        tmp_path,
        "--worker-socket", str(tmp_path / "worker" / "worker.sock"),
        "--atelet-socket", "",
        "--max-actors", "0",
        "--runsc", str(node_.install_runsc_standin(tmp_path / "bin")),
    )  # fmt: skip
    try:
        worker = connect(tmp_path / "worker" / "worker.sock")
        actor = Actor(tmp_path / "actor", runsc=agent.runsc).prepare()
        assert status_of(worker.RunWorkload, actor.run(), timeout=30) == (
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            "worker is full: 0 actors",
        )
    finally:
        agent.terminate()


@pytest.mark.parametrize("value", ["-1", str(2**31)])
def test_max_actors_out_of_range_is_a_usage_error(tmp_path, value):
    """A negative count (upstream refuses it too) or one beyond the report's int32."""
    agent = AgentProcess(tmp_path, "--stdin", "--max-actors", value)
    assert agent.wait() != 0
    assert f"--max-actors: {value} must be between 0 and 2147483647" in agent.stderr()
