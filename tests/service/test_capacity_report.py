"""The capacity report to atelet: what is sent, to whom, and how failures are outlasted.

The atelet here is :class:`substrate_gpu.testing.atelet.FakeAtelet`: grpcio's own server over
mutual TLS on a Unix socket, built from our transcription of atelet.proto, so every request
is parsed by a real gRPC implementation; the certificates are Pod certificates with a
SPIFFE URI SAN and a Pod identity (tests/support/spiffe.py).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path

import anyio
import grpc
import pytest
from cryptography.x509.oid import ExtendedKeyUsageOID
from support import spiffe

from substrate_gpu import preflight
from substrate_gpu.service import atelet_dial, capacity_report
from substrate_gpu.service.atelet import atelet_pb2 as pb
from substrate_gpu.service.capacity_report import RegistrationState
from substrate_gpu.testing import atelet as fake

FAST = 0.02  # first backoff in the tests (production: 0.5 s)


# --- what is sent ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("milli", "quantity"),
    [
        pytest.param(2000, "2", id="whole-cores"),
        pytest.param(1500, "1500m", id="fraction"),
        pytest.param(500, "500m", id="half"),
        pytest.param(100_000, "100", id="hundred-cores"),
        pytest.param(1_000_000, "1k", id="thousand-cores"),
        pytest.param(12_345, "12345m", id="odd"),
    ],
)
def test_cpu_is_written_as_kubernetes_writes_a_milli_quantity(milli, quantity):
    """``resource.NewMilliQuantity(m, DecimalSI).String()``, as upstream reports it."""
    assert capacity_report.milli_quantity(milli) == quantity


@pytest.mark.parametrize(
    ("count", "quantity"),
    [
        pytest.param(4_294_967_296, "4Gi", id="gibibytes"),
        pytest.param(1536 * 1024 * 1024, "1536Mi", id="mebibytes"),
        pytest.param(1_000_000_000, "1000000000", id="not-a-power-of-1024"),
        pytest.param(1536, "1536", id="not-a-multiple-of-1024"),
        pytest.param(1000, "1k", id="under-1024-is-decimal"),
        pytest.param(512, "512", id="small"),
    ],
)
def test_memory_is_written_as_kubernetes_writes_a_binary_quantity(count, quantity):
    """``resource.NewQuantity(n, BinarySI).String()``."""
    assert capacity_report.binary_quantity(count) == quantity


def _capacity(tmp_path: Path, cpu: str | None, memory: str | None) -> Path:
    directory = tmp_path / "capacity"
    directory.mkdir(exist_ok=True)
    for name, value in (("cpu_milli", cpu), ("memory_bytes", memory)):
        if value is not None:
            (directory / name).write_text(value)
    return directory


@pytest.mark.parametrize(
    ("cpu", "memory", "limits"),
    [
        # Upstream's own table (internal/ateom/register_test.go).
        pytest.param("2000", "4294967296", [("cpu", "2"), ("memory", "4Gi")], id="limits-set"),
        pytest.param("2Gi", "", [], id="unparseable-is-none"),
        pytest.param("-1", "-1", [], id="negative-is-none"),
        pytest.param(None, None, [], id="missing-is-none"),
        pytest.param("1500\n", None, [("cpu", "1500m")], id="only-cpu-with-newline"),
        pytest.param("1_000", "0x10", [], id="not-go-integers"),
        pytest.param("9223372036854775808", None, [], id="beyond-int64"),
    ],
)
def test_the_capacity_files_become_the_reports_limits(tmp_path, cpu, memory, limits):
    """A file that is missing or unusable is 0, and a 0 is left out (the control plane
    reads it as none); no limit at all leaves ``resources`` unset."""
    cpu_milli, memory_bytes = capacity_report.read_capacity(_capacity(tmp_path, cpu, memory))
    request = capacity_report.register_request(
        actors=7, cpu_milli=cpu_milli, memory_bytes=memory_bytes, architecture="amd64"
    )
    assert [(x.name, x.quantity) for x in request.capacity.resources.limits] == limits
    assert request.capacity.HasField("resources") == bool(limits)
    assert request.capacity.actors == 7
    assert dict(request.hardware.attributes) == {"architecture": "amd64"}


def test_an_unusable_capacity_file_is_warned_about(tmp_path):
    """The warning names the file and what was in it."""
    from structlog.testing import capture_logs

    directory = _capacity(tmp_path, "lots", None)
    with capture_logs() as logs:
        assert capacity_report.read_limit(directory / "cpu_milli") == 0
        assert capacity_report.read_limit(directory / "memory_bytes") == 0
    assert [(e["event"], e.get("value")) for e in logs] == [
        ("ignoring unusable capacity limit", "lots"),
        ("ignoring unreadable capacity limit", None),
    ]
    assert logs[0]["path"] == str(directory / "cpu_milli")


def test_the_backoff_doubles_from_half_a_second_to_thirty():
    """Upstream's schedule: 0.5 s, doubling, at most 30 s."""
    waits = capacity_report.backoffs()
    assert [next(waits) for _ in range(9)] == [0.5, 1, 2, 4, 8, 16, 30, 30, 30]


def test_the_method_is_upstreams():
    """The path atelet serves the call on, from our .proto."""
    assert capacity_report.REGISTER_WORKER == "/atelet.WorkerSupport/RegisterWorker"


def test_the_registration_states_are_the_metrics_labels():
    """One set of states: the metric's labels are the enum's values."""
    from substrate_gpu.observability import metrics

    assert [s.value for s in RegistrationState] == list(metrics.ATELET_REGISTRATION_STATES)


# --- the node: certificates, files, an atelet -------------------------------------------------


@dataclass
class Node:
    """One worker pod's files and its node's atelet credentials."""

    root: Path
    signer: spiffe.Signer
    worker: spiffe.PodCertificate
    atelet: spiffe.PodCertificate

    @property
    def socket(self) -> Path:
        return self.root / "ate" / "worker-support.sock"

    def config(self, **overrides: object) -> capacity_report.ReportConfig:
        values: dict[str, object] = {
            "socket": self.socket,
            "credential_bundle": self.root / "identity" / "credential-bundle.pem",
            "trust_bundle": self.root / "identity" / "trust-bundle.pem",
            "actors": 12,
            "capacity_dir": _capacity(self.root, "1500", "2147483648"),
            **overrides,
        }
        return capacity_report.ReportConfig(**values)  # type: ignore[arg-type]

    def atelet_serving(
        self,
        certificate: spiffe.PodCertificate | None = None,
        answers: list[fake.Answer] | None = None,
    ) -> fake.FakeAtelet:
        presented = certificate or self.atelet
        return fake.FakeAtelet(
            self.socket,
            presented.chain_pem,
            presented.key_pem,
            self.signer.trust_bundle(),
            list(answers or []),
        )


@pytest.fixture
def node(tmp_path) -> Node:
    signer = spiffe.Signer()
    worker = signer.pod(spiffe.WORKER_SA, pod="gpu-pool-workers-abc12")
    atelet = signer.pod(spiffe.ATELET_SA, pod="atelet-x7k2q")
    identity = tmp_path / "identity"
    identity.mkdir()
    (identity / "credential-bundle.pem").write_bytes(worker.bundle())
    (identity / "trust-bundle.pem").write_bytes(signer.trust_bundle())
    return Node(tmp_path, signer, worker, atelet)


async def _report(config: capacity_report.ReportConfig) -> capacity_report.Registration:
    registration = capacity_report.Registration()
    with anyio.fail_after(30):
        await capacity_report.report(config, registration, initial_backoff=FAST)
    return registration


@pytest.mark.anyio
async def test_atelet_receives_the_capacity_and_the_hardware(node):
    """One accepted call, carrying ``--max-actors``, the container's limits and the host's
    architecture, from the worker's own certificate."""
    async with node.atelet_serving() as atelet:
        registration = await _report(node.config())
    assert registration.state is RegistrationState.REGISTERED
    [call] = atelet.received
    assert call.request == pb.RegisterWorkerRequest(
        capacity=pb.WorkerResources(
            actors=12,
            resources=pb.Resources(
                limits=[
                    pb.Limits(name="cpu", quantity="1500m"),
                    pb.Limits(name="memory", quantity="2Gi"),
                ]
            ),
        ),
        hardware=pb.HardwareIdentity(attributes={"architecture": preflight.host_architecture()}),
    )
    assert call.peer_certificate == node.worker.chain_pem


@pytest.mark.anyio
async def test_a_report_made_before_atelet_is_up_lands_when_it_comes(node):
    """atelet absent at start (no socket): retried, with backoff, until it serves."""
    registration = capacity_report.Registration()
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(
            lambda: capacity_report.report(node.config(), registration, initial_backoff=FAST)
        )
        with anyio.fail_after(10):
            while registration.attempts < 3:
                await anyio.sleep(0.01)
        assert registration.state is RegistrationState.REPORTING
        assert "cannot connect to atelet's socket" in registration.detail
        async with node.atelet_serving() as atelet:
            await atelet.wait_for(1)
            with anyio.fail_after(10):
                while registration.state is not RegistrationState.REGISTERED:
                    await anyio.sleep(0.01)
    assert len(atelet.received) == 1


def _impostors(node: Node) -> dict[str, spiffe.PodCertificate]:
    other_signer = spiffe.Signer(name="another-cluster")
    return {
        "another workload of the cluster": node.signer.pod(spiffe.WORKER_SA, pod="neighbour"),
        "atelet of another node": node.signer.pod(
            spiffe.ATELET_SA, node=("gpu-node-2", "d3c4b5a6-0000-4000-8000-000000000002")
        ),
        "atelet's name on another node UID": node.signer.pod(
            spiffe.ATELET_SA, node=(spiffe.NODE[0], "d3c4b5a6-0000-4000-8000-000000000003")
        ),
        "atelet without a Pod identity": node.signer.pod(spiffe.ATELET_SA, node=None),
        "two URI SANs": node.signer.pod(
            spiffe.ATELET_SA,
            uris=[spiffe.spiffe_id(*spiffe.ATELET_SA), spiffe.spiffe_id("other", "atelet")],
        ),
        "an untrusted signer": other_signer.pod(spiffe.ATELET_SA),
        "a certificate not for servers": node.signer.pod(
            spiffe.ATELET_SA, usages=[ExtendedKeyUsageOID.CLIENT_AUTH]
        ),
    }


@pytest.mark.parametrize(
    ("impostor", "says"),
    [
        pytest.param(
            "another workload of the cluster", "node-local peer is not atelet", id="spiffe-id"
        ),
        pytest.param(
            "atelet of another node", "atelet is not on worker node 'gpu-node-1'", id="node"
        ),
        pytest.param("atelet's name on another node UID", "is not on worker node", id="node-uid"),
        pytest.param("atelet without a Pod identity", "is not on worker node", id="no-identity"),
        pytest.param("two URI SANs", "2 URI SANs", id="two-sans"),
        pytest.param("an untrusted signer", "atelet's certificate was refused", id="untrusted"),
        pytest.param("a certificate not for servers", "atelet's certificate was refused", id="eku"),
    ],
)
@pytest.mark.anyio
async def test_a_peer_that_is_not_this_nodes_atelet_gets_nothing(node, impostor, says):
    """The handshake or the identity check refuses it before the request is sent; the
    report keeps retrying (a real atelet may take the socket over)."""
    registration = capacity_report.Registration()
    async with node.atelet_serving(_impostors(node)[impostor]) as atelet:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(
                lambda: capacity_report.report(node.config(), registration, initial_backoff=FAST)
            )
            with anyio.fail_after(10):
                while registration.attempts < 2:
                    await anyio.sleep(0.01)
            tasks.cancel_scope.cancel()
    assert atelet.received == []
    assert registration.state is RegistrationState.REPORTING
    assert says in registration.detail


@pytest.mark.anyio
async def test_a_report_outlasts_an_atelet_that_restarts(node):
    """atelet answers UNAVAILABLE (no Worker record yet), goes away, and a new atelet on the
    same socket accepts; once accepted, nothing more is sent."""
    registration = capacity_report.Registration()
    not_yet = (grpc.StatusCode.UNAVAILABLE, "worker record does not exist yet")
    async with anyio.create_task_group() as tasks:
        async with node.atelet_serving(answers=[not_yet] * 100) as first:
            tasks.start_soon(
                lambda: capacity_report.report(node.config(), registration, initial_backoff=FAST)
            )
            await first.wait_for(2)
        assert registration.state is RegistrationState.REPORTING
        assert "worker record does not exist yet" in registration.detail
        async with node.atelet_serving() as second:
            await second.wait_for(1)
            with anyio.fail_after(10):
                while registration.state is not RegistrationState.REGISTERED:
                    await anyio.sleep(0.01)
            await anyio.sleep(0.3)  # several backoffs: would be enough for a resend
    assert len(second.received) == 1
    assert second.received[0].request == first.received[0].request


#: Injected into report() so the silent-atelet test takes a second, not a minute.
SILENT_TIMEOUT = 0.3
#: How late a wait may end on a loaded 2-core machine.
SLACK = 2.0


@pytest.mark.parametrize(
    "answers_handshake",
    [
        pytest.param(False, id="silent-from-the-handshake"),
        pytest.param(True, id="silent-after-the-request"),
    ],
)
@pytest.mark.anyio
async def test_an_atelet_that_never_answers_costs_each_attempt_its_call_timeout(
    node, answers_handshake
):
    """atelet accepts the connection and never answers (not the TLS handshake; or the
    handshake, then not the request it read): each attempt is given up after the per-call
    timeout (upstream's 10 s, injected here), its connection closed, and the next one made
    after the backoff (0.02 s doubling here); the report stays ``reporting``, never raises."""
    credentials = (
        {
            "certificate_chain": node.atelet.chain_pem,
            "private_key": node.atelet.key_pem,
            "client_ca": node.signer.trust_bundle(),
        }
        if answers_handshake
        else {}
    )
    registration = capacity_report.Registration()
    async with fake.silent(node.socket, **credentials) as atelet:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(
                lambda: capacity_report.report(
                    node.config(),
                    registration,
                    initial_backoff=FAST,
                    call_timeout=SILENT_TIMEOUT,
                )
            )
            held = await atelet.wait_for(4, timeout=30)
            tasks.cancel_scope.cancel()
    attempts = held[:4]
    for attempt in attempts[:3]:
        assert attempt.closed_at is not None
        waited = attempt.closed_at - attempt.accepted_at
        assert SILENT_TIMEOUT * 0.8 <= waited < SILENT_TIMEOUT + SLACK, waited
    for (before, after), backoff in zip(
        itertools.pairwise(attempts), capacity_report.backoffs(FAST), strict=False
    ):
        assert before.closed_at is not None
        gap = after.accepted_at - before.closed_at
        assert backoff * 0.7 <= gap < backoff + SLACK, (gap, backoff)
    paths = {a.path for a in attempts[:3]}
    assert paths == ({capacity_report.REGISTER_WORKER} if answers_handshake else {None})
    assert registration.state is RegistrationState.REPORTING
    assert f"no answer within {SILENT_TIMEOUT:g} s" in registration.detail


@pytest.mark.anyio
async def test_every_status_atelet_answers_is_retried(node):
    """Upstream retries whatever atelet answers: a refusal may be the control plane's
    passing state, and nothing else will ever report."""
    answers: list[fake.Answer] = [
        (grpc.StatusCode.INVALID_ARGUMENT, "capacity: Invalid value"),
        (grpc.StatusCode.PERMISSION_DENIED, "not a worker"),
        (grpc.StatusCode.INTERNAL, "boom"),
    ]
    async with node.atelet_serving(answers=answers) as atelet:
        registration = await _report(node.config())
    assert registration.state is RegistrationState.REGISTERED
    assert registration.attempts == 4
    assert len(atelet.received) == 4


@pytest.mark.parametrize(
    ("change", "says"),
    [
        pytest.param(
            {"credential_bundle": Path("/nonexistent/bundle.pem")},
            "while reading the credential bundle",
            id="no-bundle",
        ),
        pytest.param(
            {"trust_bundle": Path("/nonexistent/trust.pem")},
            "while reading the trust bundle",
            id="no-trust",
        ),
        pytest.param(
            {"atelet_spiffe_id": ""}, "--atunnel-broker-identity is empty", id="no-identity-flag"
        ),
    ],
)
@pytest.mark.anyio
async def test_a_misconfiguration_stops_the_report_at_once(node, change, says):
    """What no retry changes is not retried (upstream's worker exits on it): the report
    says why and returns; it never raises."""
    registration = await _report(node.config(**change))
    assert registration.state is RegistrationState.STOPPED
    assert says in registration.detail
    assert registration.attempts == 0


@pytest.mark.parametrize(
    ("bundle", "says"),
    [
        pytest.param(lambda n: n.worker.chain_pem, "no PRIVATE KEY block found", id="no-key"),
        pytest.param(
            lambda n: n.worker.key_pem, "no CERTIFICATE blocks found", id="no-certificate"
        ),
        pytest.param(
            lambda n: (
                n.worker.bundle()
                + b"-----BEGIN EC PRIVATE KEY-----\nAAAA\n-----END EC PRIVATE KEY-----\n"
            ),
            "unknown PEM block type 'EC PRIVATE KEY'",
            id="other-block",
        ),
        pytest.param(
            lambda n: n.signer.pod(spiffe.WORKER_SA, node=None).bundle(),
            "has no valid Pod identity (no Pod identity extension)",
            id="no-pod-identity",
        ),
        pytest.param(
            lambda n: n.signer.pod(spiffe.WORKER_SA, identity=b'{"Namespace": "default"}').bundle(),
            "empty fields: ServiceAccountName, ServiceAccountUID, PodName, PodUID, NodeName, NodeUID",
            id="incomplete-pod-identity",
        ),
        pytest.param(
            lambda n: n.signer.pod(spiffe.WORKER_SA, identity=b"not json").bundle(),
            "Pod identity extension is not JSON",
            id="pod-identity-not-json",
        ),
    ],
)
def test_a_credential_bundle_that_cannot_be_used_is_named(node, bundle, says):
    """The bundle's format is Kubernetes Pod Certificates' (a PRIVATE KEY, then the chain),
    and the worker's own certificate must carry its Pod identity (its node is atelet's)."""
    path = node.root / "identity" / "credential-bundle.pem"
    path.write_bytes(bundle(node))
    with pytest.raises(atelet_dial.CredentialError) as raised:
        atelet_dial.AteletDialer(
            node.socket,
            path,
            node.root / "identity" / "trust-bundle.pem",
            spiffe.spiffe_id(*spiffe.ATELET_SA),
        )
    assert says in str(raised.value)
    assert str(path) in str(raised.value)


def test_go_json_keys_match_without_case(node):
    """Go's encoding/json reads the Pod identity's keys case-insensitively; so do we."""
    raw = spiffe.pod_identity_json(*spiffe.WORKER_SA, "p", spiffe.NODE).replace(
        b"NodeName", b"nodename"
    )
    certificate = node.signer.pod(spiffe.WORKER_SA, identity=raw).certificate
    identity = atelet_dial.pod_identity(certificate)
    assert identity is not None
    assert identity.node_name == spiffe.NODE[0]


@pytest.mark.anyio
async def test_a_rotated_credential_bundle_is_presented_on_the_next_attempt(node):
    """Each attempt reads the bundles as they are now: the kubelet rotates the certificate."""
    rotated = node.signer.pod(spiffe.WORKER_SA, pod="gpu-pool-workers-abc12")
    not_yet = (grpc.StatusCode.UNAVAILABLE, "not yet")
    async with node.atelet_serving(answers=[not_yet]) as atelet:
        registration = capacity_report.Registration()
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(
                lambda: capacity_report.report(node.config(), registration, initial_backoff=0.5)
            )
            await atelet.wait_for(1)
            (node.root / "identity" / "credential-bundle.pem").write_bytes(rotated.bundle())
            await atelet.wait_for(2)
    assert [c.peer_certificate for c in atelet.received] == [
        node.worker.chain_pem,
        rotated.chain_pem,
    ]
