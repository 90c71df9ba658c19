"""The agent in a GPU worker pod: its real flags, state on the node, probes, grace, taint."""

from __future__ import annotations

import re
from pathlib import Path, PurePosixPath
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]  # ships no py.typed; test-only
import pytest
import yaml
from pool_cases import IMAGE, pool

from substrate_gpu import cli
from substrate_gpu.cli import _agent
from substrate_gpu.pools import (
    ControllerSettings,
    load_pool,
    manifests,
    render_worker_deployment,
    worker_agent,
)
from substrate_gpu.service import config, worker_shutdown

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "tests" / "data" / "pools" / "valid").glob("*.yaml"))
SETTINGS = ControllerSettings(driver_root="/usr/local/nvidia", default_image=IMAGE)
GPU_POOL = load_pool(pool({"resourceRequests": {"nvidia.com/gpu": "2"}, "maxWorkers": 3}))
CPU_POOL = load_pool(pool({"replicas": 2, "template": {"resources": {"requests": {"cpu": "1"}}}}))


def pod_spec(deployment: dict[str, Any]) -> dict[str, Any]:
    return deployment["spec"]["template"]["spec"]


def gpu_container(deployment: dict[str, Any]) -> dict[str, Any]:
    """The container holding the pool's GPUs (there must be exactly one)."""
    holding = [
        c
        for c in pod_spec(deployment)["containers"]
        if "nvidia.com/gpu" in c.get("resources", {}).get("limits", {})
    ]
    assert len(holding) == 1, holding
    return holding[0]


def agent_config(container: dict[str, Any]) -> config.AgentConfig:
    """What the container's command line configures, parsed by the real CLI parser."""
    assert container["command"] == ["substrate-gpu"]
    args = cli.build_parser().parse_args(container["args"])
    assert args.handler is _agent.run
    assert not args.demo
    return _agent.config_from(args)


def mount_of(container: dict[str, Any], path: str) -> dict[str, Any]:
    """The volume mount ``path`` lies under (the deepest one)."""
    under = [
        m
        for m in container["volumeMounts"]
        if PurePosixPath(path).is_relative_to(PurePosixPath(m["mountPath"]))
    ]
    assert under, f"{path} is on no volume: it would not outlive the container"
    return max(under, key=lambda m: len(m["mountPath"]))


def volume(deployment: dict[str, Any], name: str) -> dict[str, Any]:
    [found] = [v for v in pod_spec(deployment)["volumes"] if v["name"] == name]
    return found


def example_deployments(*, gpu_only: bool) -> list[Any]:
    params = []
    for path in EXAMPLES:
        for doc in manifests.read_documents(path):
            p = load_pool(doc.content)
            if p.is_gpu_pool or not gpu_only:
                d = render_worker_deployment(p, SETTINGS)
                params.append(pytest.param(d, id=f"{path.stem}-{p.name}"))
    assert len(params) >= 3
    return params


GPU_DEPLOYMENTS = example_deployments(gpu_only=True)
ALL_DEPLOYMENTS = example_deployments(gpu_only=False)


@pytest.mark.parametrize("deployment", GPU_DEPLOYMENTS)
def test_the_gpu_container_runs_the_real_agent_with_explicit_arguments(
    deployment: dict[str, Any],
) -> None:
    """The container with the GPUs runs `substrate-gpu agent` on a socket, never the demo."""
    settings = agent_config(gpu_container(deployment))
    assert settings.socket == Path(worker_agent.SOCKET)
    assert settings.toolkit_dir == Path("/opt/nvidia-toolkit")
    assert {"name": "nvidia-toolkit", "mountPath": "/opt/nvidia-toolkit", "readOnly": True} in (
        gpu_container(deployment)["volumeMounts"]
    )


@pytest.mark.parametrize("deployment", GPU_DEPLOYMENTS)
def test_event_log_and_checkpoints_live_on_a_host_directory_keyed_by_pool_and_pod(
    deployment: dict[str, Any],
) -> None:
    """Both are on the state hostPath, in a subdirectory named by namespace, pool and pod."""
    container = gpu_container(deployment)
    settings = agent_config(container)
    for path in (settings.event_log, settings.checkpoint_root):
        assert path is not None
        mount = mount_of(container, str(path))
        assert mount["name"] == worker_agent.STATE_VOLUME
        assert "hostPath" in volume(deployment, mount["name"])
        # Every $(VAR) of the key is the downward API's namespace, pool label or pod name.
        env = {
            e["name"]: e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
            for e in container["env"]
        }
        key = [env[v] for v in re.findall(r"\$\((\w+)\)", mount["subPathExpr"])]
        assert key == [
            "metadata.namespace",
            "metadata.labels['ate.dev/worker-pool']",
            "metadata.name",
        ]


@pytest.mark.parametrize("deployment", GPU_DEPLOYMENTS)
def test_the_socket_is_on_a_host_directory_short_enough_for_a_unix_socket(
    deployment: dict[str, Any],
) -> None:
    """The socket's host path, keyed by pod uid, stays under the 107-byte sun_path limit."""
    container = gpu_container(deployment)
    mount = mount_of(container, worker_agent.SOCKET)
    host_dir = volume(deployment, mount["name"])["hostPath"]["path"]
    env = {
        e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"]
        for e in container["env"]
        if "valueFrom" in e
    }
    assert [env[v] for v in re.findall(r"\$\((\w+)\)", mount["subPathExpr"])] == ["metadata.uid"]
    uid = "0" * 36  # a pod uid is a 36-character UUID
    on_host = PurePosixPath(
        host_dir, uid, PurePosixPath(worker_agent.SOCKET).relative_to(mount["mountPath"])
    )
    assert len(str(on_host).encode()) <= 107


@pytest.mark.parametrize("deployment", GPU_DEPLOYMENTS)
def test_the_agents_whole_shutdown_fits_the_grace_period(deployment: dict[str, Any]) -> None:
    """On SIGTERM the agent takes at most ``--workload-grace`` (calls in flight, then the apps'
    SIGTERM), the SIGKILL wait, then ``--drain-timeout``: with the closing margin that is the
    pod's grace, so the kubelet's SIGKILL never cuts a checkpoint or the log's close short."""
    settings = agent_config(gpu_container(deployment))
    grace = pod_spec(deployment)["terminationGracePeriodSeconds"]
    used = settings.workload_grace + worker_shutdown.KILL_TIMEOUT + settings.drain_timeout
    assert 10 <= grace - used <= 30


@pytest.mark.parametrize("deployment", GPU_DEPLOYMENTS)
def test_checkpoints_in_flight_get_upstreams_workload_grace(deployment: dict[str, Any]) -> None:
    """``--workload-grace`` is upstream's ``workloadGracePeriod`` (30 minutes) inside upstream's
    60-minute pod grace, so a checkpoint in flight at SIGTERM has as long to finish as
    upstream's worker gives it, and the apps get SIGKILL from the worker, not the kubelet."""
    settings = agent_config(gpu_container(deployment))
    assert settings.workload_grace == 1800
    assert pod_spec(deployment)["terminationGracePeriodSeconds"] == 3600


@pytest.mark.parametrize("deployment", GPU_DEPLOYMENTS)
def test_probes_ask_the_agents_health_endpoints_on_its_declared_metrics_port(
    deployment: dict[str, Any],
) -> None:
    """Liveness and startup ask /healthz, readiness /readyz, on the port the agent serves."""
    container = gpu_container(deployment)
    settings = agent_config(container)
    [port] = container["ports"]
    assert (port["containerPort"], settings.metrics_port) == (9477, 9477)
    # The kubelet probes the pod's IP: loopback would fail every probe.
    assert settings.metrics_host == "0.0.0.0"
    paths = {
        probe: (container[probe]["httpGet"]["path"], container[probe]["httpGet"]["port"])
        for probe in ("startupProbe", "livenessProbe", "readinessProbe")
    }
    assert paths == {
        "startupProbe": ("/healthz", port["name"]),
        "livenessProbe": ("/healthz", port["name"]),
        "readinessProbe": ("/readyz", port["name"]),
    }


@pytest.mark.parametrize("deployment", GPU_DEPLOYMENTS)
def test_gpu_workers_tolerate_the_gpu_taint_once(deployment: dict[str, Any]) -> None:
    """The agent lands on tainted GPU nodes; a pool's own toleration is not doubled."""
    tolerations = pod_spec(deployment)["tolerations"]
    assert tolerations.count(worker_agent.GPU_TOLERATION) == 1


@pytest.mark.parametrize("deployment", ALL_DEPLOYMENTS)
def test_the_rendered_worker_pod_is_a_valid_kubernetes_pod(deployment: dict[str, Any]) -> None:
    """The pod template, as a Pod, passes the core/v1 schema (strict)."""
    template = deployment["spec"]["template"]
    kubernetes_validate.validate(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "w", **template["metadata"]},
            "spec": template["spec"],
        },
        "1.34.0",  # the podCertificate projection (docs/worker-api.md)
        strict=True,
    )


def test_a_gpu_worker_has_the_security_context_of_a_cpu_worker() -> None:
    """Pod and container security contexts exactly like a CPU gVisor worker's (upstream's),
    and no user namespace in either."""
    gpu, cpu = (render_worker_deployment(p, SETTINGS) for p in (GPU_POOL, CPU_POOL))
    assert pod_spec(gpu)["securityContext"] == pod_spec(cpu)["securityContext"]
    [gpu_worker], [cpu_worker] = (pod_spec(d)["containers"] for d in (gpu, cpu))
    assert gpu_worker["securityContext"] == cpu_worker["securityContext"]
    assert gpu_worker["securityContext"]["privileged"] is False
    for d in (gpu, cpu):
        assert "hostUsers" not in pod_spec(d)


def test_a_cpu_worker_does_not_run_the_agent() -> None:
    """The agent is GPU shaping: a CPU pool's container keeps its image's own command."""
    [container] = pod_spec(render_worker_deployment(CPU_POOL, SETTINGS))["containers"]
    assert not {"command", "args", "ports", "livenessProbe"} & container.keys()


def test_no_shipped_manifest_runs_the_demo() -> None:
    """Nothing under deploy/ asks for --demo, and every substrate-gpu container names its
    subcommand (no image default decides what runs)."""
    containers = 0
    for path in sorted((ROOT / "deploy").rglob("*.yaml")):
        assert "--demo" not in path.read_text(encoding="utf-8"), path
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            template = doc.get("spec", {}).get("template", {})
            for container in template.get("spec", {}).get("containers", []):
                if (
                    container.get("command", [None])[0] == "substrate-gpu"
                    or "substrate-gpu" in container["image"]
                ):
                    containers += 1
                    args = list(container["args"])
                    if args[:1] == ["--log-level"]:  # the one global option, before it
                        args = args[2:]
                    assert args[0] in {"agent", "controller"}, (path, container)
    assert containers >= 4


@pytest.mark.parametrize("deployment", GPU_DEPLOYMENTS)
def test_a_worker_reads_its_pools_earlier_workers_state_read_only(
    deployment: dict[str, Any],
) -> None:
    """The pool's directory (every worker's, this one's included) is mounted read-only, so a
    replacement restores from a replaced pod's checkpoints on the same node."""
    container = gpu_container(deployment)
    [own] = [
        m for m in container["volumeMounts"] if m["mountPath"] == worker_agent.STATE_MOUNT_PATH
    ]
    [pool_view] = [
        m for m in container["volumeMounts"] if m["mountPath"] == worker_agent.POOL_STATE_MOUNT_PATH
    ]
    assert pool_view["name"] == own["name"]
    assert pool_view["readOnly"] is True
    # The pool's key is the own directory's parent: the view holds exactly the pool's workers.
    assert own["subPathExpr"].rpartition("/")[0] == pool_view["subPathExpr"]


def test_docs_show_the_command_line_the_pods_run() -> None:
    """docs/agent.md's pod table quotes the exact command line a GPU worker runs."""
    command = " ".join([*worker_agent.AGENT_COMMAND, *worker_agent.AGENT_ARGS])
    assert f"`{command}`" in (ROOT / "docs" / "agent.md").read_text(encoding="utf-8")


@pytest.mark.parametrize("deployment", GPU_DEPLOYMENTS)
def test_the_worker_api_is_served_where_atelet_dials_it(deployment: dict[str, Any]) -> None:
    """``--worker-socket`` is upstream's ``nodepath.WorkerSocketPath(podUID)``:
    ``/var/lib/ate/workers/<pod uid>/worker.sock``, on the host's ``/var/lib/ate`` mounted at
    the same path (as atelet mounts it), the uid from the downward API, under 107 bytes."""
    container = gpu_container(deployment)
    settings = agent_config(container)
    assert str(settings.worker_socket) == "/var/lib/ate/workers/$(POD_UID)/worker.sock"
    env = {
        e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"]
        for e in container["env"]
        if "valueFrom" in e
    }
    assert env["POD_UID"] == "metadata.uid"
    mount = mount_of(container, str(settings.worker_socket))
    # HostToContainer, as upstream's: what atelet mounts there later is seen in the worker.
    assert mount == {
        "name": worker_agent.ATE_VOLUME,
        "mountPath": "/var/lib/ate",
        "mountPropagation": "HostToContainer",
    }
    assert volume(deployment, mount["name"])["hostPath"]["path"] == "/var/lib/ate"
    on_host = str(settings.worker_socket).replace("$(POD_UID)", "0" * 36)
    assert len(on_host.encode()) <= 107


@pytest.mark.parametrize("deployment", GPU_DEPLOYMENTS)
def test_every_actor_of_a_gpu_worker_gets_the_pods_network(deployment: dict[str, Any]) -> None:
    """``--sandbox-network pod``, whatever the pool: upstream's worker gives every actor a
    network (its WorkerPool and ActorTemplate have no field that asks for one or refuses it),
    and the pod's namespace is the one a worker gives without per-actor namespaces. No
    ``--runsc-flag`` says otherwise (the parser refuses the two together)."""
    conf = agent_config(gpu_container(deployment))
    assert conf.sandbox_network == "pod"
    assert not [f for f in conf.runsc_flags if f.lstrip("-").startswith("network")]


# --- what the capacity report to atelet needs (docs/worker-api.md) --------------------------


def test_the_agent_reports_to_atelet_with_upstreams_defaults() -> None:
    """The command line reports ``--max-actors`` 1000 to atelet's socket as atelet's
    canonical identity expects: upstream's controller passes neither of those."""
    conf = agent_config(gpu_container(render_worker_deployment(GPU_POOL, SETTINGS)))
    assert conf.max_actors == 1000
    assert conf.atelet_socket == Path("/var/lib/ate/worker-support.sock")
    assert conf.atelet_spiffe_id == "spiffe://cluster.local/ns/ate-system/sa/atelet"


def test_the_bundles_the_agent_reads_are_the_projected_pod_certificate() -> None:
    """``--atunnel-credential-bundle`` and ``--atunnel-trust-bundle`` name the files of the
    read-only projection of the pod's certificate and its signer's trust bundle."""
    deployment = render_worker_deployment(GPU_POOL, SETTINGS)
    container = gpu_container(deployment)
    conf = agent_config(container)
    for path in (conf.credential_bundle, conf.trust_bundle):
        mount = mount_of(container, str(path))
        assert mount["name"] == worker_agent.IDENTITY_VOLUME
        assert mount["readOnly"] is True
        assert path.parent == PurePosixPath(mount["mountPath"])
    sources = volume(deployment, worker_agent.IDENTITY_VOLUME)["projected"]["sources"]
    assert sources == [
        {
            "podCertificate": {
                "signerName": "podidentity.podcert.ate.dev/identity",
                "keyType": "ECDSAP256",
                "credentialBundlePath": conf.credential_bundle.name,
            }
        },
        {
            "clusterTrustBundle": {
                "signerName": "podidentity.podcert.ate.dev/identity",
                "labelSelector": {"matchLabels": {"podcert.ate.dev/canarying": "live"}},
                "path": conf.trust_bundle.name,
            }
        },
    ]


def test_the_capacity_files_are_the_agent_containers_own_limits() -> None:
    """``--capacity-dir`` is a read-only downward-API volume of this container's limits, in
    millicores (a fractional CPU is not rounded up to a core) and bytes."""
    deployment = render_worker_deployment(GPU_POOL, SETTINGS)
    container = gpu_container(deployment)
    conf = agent_config(container)
    mount = mount_of(container, str(conf.capacity_dir / "cpu_milli"))
    assert (mount["name"], mount["mountPath"], mount["readOnly"]) == (
        worker_agent.CAPACITY_VOLUME,
        str(conf.capacity_dir),
        True,
    )
    items = volume(deployment, worker_agent.CAPACITY_VOLUME)["downwardAPI"]["items"]
    assert items == [
        {
            "path": "cpu_milli",
            "resourceFieldRef": {
                "containerName": container["name"],
                "resource": "limits.cpu",
                "divisor": "1m",
            },
        },
        {
            "path": "memory_bytes",
            "resourceFieldRef": {
                "containerName": container["name"],
                "resource": "limits.memory",
                "divisor": "1",
            },
        },
    ]


@pytest.mark.parametrize("deployment", GPU_DEPLOYMENTS)
def test_every_variable_the_kubelet_expands_is_the_containers_env(
    deployment: dict[str, Any],
) -> None:
    """Each ``$(VAR)`` in the args and the subPathExprs is a downward-API variable of the
    container (the kubelet leaves an undefined one as written)."""
    container = gpu_container(deployment)
    defined = {e["name"] for e in container["env"] if "valueFrom" in e}
    texts = [*container["args"], *(m.get("subPathExpr", "") for m in container["volumeMounts"])]
    used = {v for text in texts for v in re.findall(r"\$\((\w+)\)", text)}
    assert used
    assert used <= defined
