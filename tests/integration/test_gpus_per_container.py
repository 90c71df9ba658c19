"""GPUs per container (issue 31 §10) on the runsc stand-in over real runc, with the real
injector, the worker's allocator and the ``verifying`` step, on a simulated 4-GPU node.

The sandbox's bundles are read as the worker API reads atelet's
(:func:`~substrate_gpu.service.worker_requests.read_workload`): ``trainer`` asks for GPUs 1
and 2 by their ``cdi.k8s.io/*`` annotation, ``infer`` for GPU 3 by UUID, ``side`` for none
(its image sets ``NVIDIA_VISIBLE_DEVICES=all``, as CUDA images do). Each container writes
what it sees into its rootfs and sleeps: its ``/dev/nvidia*``, which nodes the device cgroup
lets it open (a node with NVIDIA's numbers and no driver behind them: ENXIO when allowed,
EPERM when not; every GPU's node is in each rootfs too, as an image could carry them), its
NVIDIA env and ``LD_LIBRARY_PATH``, and whether the driver's files are mounted.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import anyio
import pytest
from support import runc_bundle

from substrate_gpu import cdi
from substrate_gpu.eventlog import EventLog
from substrate_gpu.injection import bundle as bundle_
from substrate_gpu.injection import toolkit
from substrate_gpu.injection.injector import WorkerGpuInjector
from substrate_gpu.lifecycle import Agent, allocation, events, sandbox
from substrate_gpu.lifecycle.gpu import GpuSettings
from substrate_gpu.probes.fd_scan import FdScanProbe
from substrate_gpu.runsc import driver
from substrate_gpu.service import worker_requests
from substrate_gpu.testing import bundles, nvidia_ctk
from substrate_gpu.testing import node as node_

pytestmark = [pytest.mark.anyio, pytest.mark.runc]

STANDIN_RUNSC = Path(__file__).resolve().parents[1] / "standins" / "runsc"
APPS = ("trainer", "infer", "side")
WAIT = 60

PROBE = r"""
{
ls /dev | grep '^nvidia' | sed 's/^/dev /'
for i in 0 1 2 3; do
  if ( : < /gpus/nvidia$i ) 2>/tmp/err; then echo "open $i ok"; else echo "open $i $(cat /tmp/err)"; fi
done
env | grep -E '^(NVIDIA_|LD_LIBRARY_PATH=)' | sed 's/^/env /'
if [ -e /usr/bin/nvidia-smi ]; then echo "smi yes"; else echo "smi no"; fi
grep -c nvidia /proc/mounts | sed 's/^/mounts /'
} > /seen.tmp 2>&1
mv /seen.tmp /seen
while true; do sleep 1; done
"""


@pytest.fixture(scope="module")
def four_gpus(require_root: None, tmp_path_factory: pytest.TempPathFactory) -> node_.SimulatedNode:
    """A 4-GPU node with NVIDIA's device numbers (195:N: opening one reaches no driver)."""
    return node_.build_node(
        tmp_path_factory.mktemp("node") / "root", gpus=(0, 1, 2, 3), real_device_nodes=True
    )


def _bundles(directory: Path, requests: dict[str, str]) -> Path:
    """``_pause`` and the apps, CRI-annotated as atelet writes them; each app runs PROBE
    with every GPU's node under /gpus and asks for ``requests[name]`` (if any)."""
    bundles.make_bundle(
        directory / sandbox.PAUSE,
        ["sh", "-c", "while true; do sleep 1; done"],
        annotations=sandbox.cri_annotations(sandbox.PAUSE),
    )
    for name in APPS:
        annotations = sandbox.cri_annotations(name)
        if name in requests:
            annotations["cdi.k8s.io/gpus"] = requests[name]
        bundles.make_bundle(
            directory / name,
            ["sh", "-c", PROBE],
            env=["PATH=/bin:/usr/bin", "NVIDIA_VISIBLE_DEVICES=all", "LD_LIBRARY_PATH=/app/lib"],
            annotations=annotations,
        )
        gpus = directory / name / "rootfs" / "gpus"
        gpus.mkdir()
        for index in range(4):
            subprocess.run(
                ["mknod", str(gpus / f"nvidia{index}"), "c", "195", str(index)], check=True
            )
    return directory


def _seen(bundle: Path, name: str) -> dict[str, list[str]]:
    """What container ``name`` wrote: kind -> its lines."""
    found: dict[str, list[str]] = {}
    for line in (bundle / name / "rootfs" / "seen").read_text().splitlines():
        kind, _, rest = line.partition(" ")
        found.setdefault(kind, []).append(rest)
    return found


def _allowed(seen: dict[str, list[str]]) -> list[int]:
    """The GPU indices whose node the container's device cgroup lets it open."""
    opened = [line.split(" ", 1) for line in seen.get("open", [])]
    return sorted(int(i) for i, result in opened if "No such device or address" in result)


async def _probed(bundle: Path) -> None:
    """Until every app container has written what it sees."""
    for name in APPS:
        with anyio.fail_after(WAIT):
            while not (bundle / name / "rootfs" / "seen").exists():
                await anyio.sleep(0.05)


async def _run_sandbox(
    node: node_.SimulatedNode,
    tmp: Path,
    requests: dict[str, str],
    runc: str,
    restore: bool,
) -> tuple[Path, list[dict[str, object]]]:
    """Register the sandbox as the worker API would, run it, wait for every app's probe
    (with ``restore``: suspend it, restore it and wait again: the probes then say what the
    restored containers see) and delete it. Returns the bundle directory and the event
    log's lines."""
    bundle = _bundles(tmp / "s", requests)
    workload = worker_requests.read_workload(str(bundle), APPS)
    root = tmp / "runsc-root"
    runtime = driver.RunscDriver(
        driver.RunscConfig(
            root=root,
            runsc=str(STANDIN_RUNSC),
            timeouts=driver.Timeouts(
                create=30, start=15, checkpoint=30, restore=30, state=10, delete=20
            ),
        )
    )
    config = toolkit.ToolkitConfig.from_env(
        {
            "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
            "NVIDIA_CTK_STANDIN_SYSTEM_ROOT": str(node.root),
            toolkit.ENV_DRIVER_ROOT: str(node.driver_root),
        },
        output_dir=tmp / "cdi",
        toolkit_dir=node.toolkit_dir,
    )
    injector = WorkerGpuInjector(
        generator=toolkit.CdiSpecGenerator(config),
        options=bundle_.InjectionOptions(
            driver_root=str(node.driver_root), dev_root=node.root, toolkit_dir=node.toolkit_dir
        ),
    )

    async def discover() -> allocation.WorkerGpus:
        spec_set = await injector.spec_set()
        return allocation.WorkerGpus.of(cdi.list_gpus(spec_set), cdi.refused_devices(spec_set))

    log_path = tmp / "events.jsonl"
    log = await EventLog.open(log_path)
    agent = Agent(
        runtime=runtime,
        probe=FdScanProbe(),
        injector=injector,
        checkpoint_root=tmp / "checkpoints",
        recorder=log,
        allocator=await allocation.GpuAllocator.discovered(discover, "w"),
        gpu=GpuSettings(
            drivers=runtime,
            driver_root=node.driver_root,
            dev_root=node.root,
            driver_preflight=False,
            nvidia_smi=None,
            sandbox_exec=runtime,
            sandbox_nvidia_smi="/usr/bin/nvidia-smi",
        ),
    )
    try:
        async with log, agent:
            await agent.submit(
                events.ActorRegistered(
                    actor_id="s",
                    gpu=True,  # a GPU worker (the worker API: any request, or GPUs here)
                    bundle=str(bundle),
                    gpu_names=workload.gpu_names,
                    containers=workload.containers,
                    container_gpus=dict(workload.container_gpus),
                )
            )
            await agent.submit(events.BundlePrepared(actor_id="s", bundle=str(bundle)))
            await agent.submit(events.RunRequested(actor_id="s"))
            await agent.wait_for_state("s", "running", timeout=WAIT)
            await _probed(bundle)
            if restore:
                await agent.submit(events.SuspendRequested(actor_id="s"))
                await agent.wait_for_state("s", "suspended", timeout=WAIT)
                for name in APPS:
                    (bundle / name / "rootfs" / "seen").unlink()
                await agent.submit(events.RestoreRequested(actor_id="s"))
                await agent.wait_for_state("s", "running", timeout=WAIT)
                await _probed(bundle)
            await agent.submit(events.DeleteRequested(actor_id="s"))
            await agent.wait_for_state("s", "deleted", timeout=WAIT)
    finally:
        runc_bundle.delete_all(root / "s", runc=runc)
    lines = [json.loads(line) for line in log_path.read_text().splitlines()[1:]]
    return bundle, lines


def _run(
    node: node_.SimulatedNode,
    tmp: Path,
    requests: dict[str, str],
    runc: str,
    *,
    restore: bool = False,
) -> tuple[Path, list[dict[str, object]]]:
    mp = pytest.MonkeyPatch()
    mp.setenv("RUNSC_STANDIN_RUNC", runc)
    mp.setenv("RUNSC_STANDIN_ARGV_LOG", str(tmp / "argv.jsonl"))
    try:
        return anyio.run(_run_sandbox, node, tmp, requests, runc, restore)
    finally:
        mp.undo()


@pytest.fixture(scope="module")
def per_container_run(
    four_gpus: node_.SimulatedNode,
    runc_path: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[Path, list[dict[str, object]]]:
    """The sandbox run with trainer: GPUs 1, 2; infer: GPU 3 by UUID; side: none; then
    suspended and restored (what the containers see is the restored sandbox's)."""
    uuid3 = nvidia_ctk.gpu_uuid(four_gpus.root, 3)
    requests = {
        "trainer": "nvidia.com/gpu=1,nvidia.com/gpu=2",
        "infer": f"nvidia.com/gpu={uuid3}",
    }
    return _run(
        four_gpus, tmp_path_factory.mktemp("per-container"), requests, runc_path, restore=True
    )


@pytest.fixture(scope="module")
def per_container(per_container_run: tuple[Path, list[dict[str, object]]]) -> Path:
    """The per-container sandbox's bundle directory."""
    return per_container_run[0]


@pytest.mark.parametrize(
    ("name", "gpus"),
    [
        pytest.param("trainer", [1, 2], id="trainer-two-gpus"),
        pytest.param("infer", [3], id="infer-one-by-uuid"),
        pytest.param("side", [], id="side-none"),
    ],
)
def test_each_container_sees_and_may_open_exactly_its_own_gpus(
    per_container: Path, name: str, gpus: list[int]
) -> None:
    """/dev holds the container's own GPU nodes only, and its device cgroup allows exactly
    those (the others' nodes in its rootfs are EPERM)."""
    seen = _seen(per_container, name)
    shown = sorted(int(d[len("nvidia") :]) for d in seen.get("dev", []) if d[6:].isdigit())
    assert shown == gpus
    assert _allowed(seen) == gpus
    for index in set(range(4)) - set(gpus):
        assert any(
            line.startswith(f"{index} ") and "Operation not permitted" in line
            for line in seen["open"]
        ), (name, index, seen["open"])


def test_a_container_naming_no_gpu_gets_no_node_no_driver_mount_and_no_nvidia_env(
    per_container: Path,
) -> None:
    """side: no /dev/nvidia* at all (not even nvidiactl), no nvidia-smi or driver library
    mounted, no CDI env, the image's NVIDIA_VISIBLE_DEVICES gone, LD_LIBRARY_PATH as the
    image set it; its config.json holds no NVIDIA device, mount or hook."""
    seen = _seen(per_container, "side")
    assert seen.get("dev", []) == []
    assert seen["smi"] == ["no"]
    assert seen["mounts"] == ["0"]
    assert seen.get("env") == ["LD_LIBRARY_PATH=/app/lib"]
    config = json.loads((per_container / "side" / "config.json").read_text())
    assert config["linux"].get("devices", []) == []
    assert not any("nvidia" in json.dumps(m) for m in config.get("mounts", []))
    assert "createContainer" not in config.get("hooks", {})


def test_a_gpu_container_gets_the_driver_and_the_cdi_env(per_container: Path) -> None:
    """trainer and infer: control nodes, nvidia-smi and the driver's libraries mounted, the
    driver library dir first in LD_LIBRARY_PATH, no NVIDIA_VISIBLE_DEVICES."""
    for name in ("trainer", "infer"):
        seen = _seen(per_container, name)
        assert {"nvidiactl", "nvidia-uvm"} <= set(seen["dev"])
        assert seen["smi"] == ["yes"]
        assert int(seen["mounts"][0]) > 0
        env = dict(e.split("=", 1) for e in seen["env"])
        assert "NVIDIA_VISIBLE_DEVICES" not in env
        assert env["LD_LIBRARY_PATH"].endswith(":/app/lib")
        assert env["LD_LIBRARY_PATH"].split(":")[0].endswith("/lib64")


def test_pause_gets_nothing(per_container: Path) -> None:
    """The sandbox's root container holds no device, as before."""
    config = json.loads((per_container / sandbox.PAUSE / "config.json").read_text())
    assert config["linux"].get("devices", []) == []


def test_the_allocation_is_the_union_and_verifying_checks_each_container_against_its_own(
    four_gpus: node_.SimulatedNode, per_container_run: tuple[Path, list[dict[str, object]]]
) -> None:
    """The registration carries each container's names; the grant is GPUs 1, 2, 3; the
    check after start and after restore lists each container's GPUs through runsc exec
    against its own set; the restore re-injected each container its own."""
    _, lines = per_container_run
    (registered,) = [e for e in lines if e["type"] == "actor_registered"]
    uuid3 = nvidia_ctk.gpu_uuid(four_gpus.root, 3)
    assert registered["v"] == 4
    assert registered["container_gpus"] == {
        "trainer": ["nvidia.com/gpu=1", "nvidia.com/gpu=2"],
        "infer": [f"nvidia.com/gpu={uuid3}"],
    }
    granted = [e["names"] for e in lines if e["type"] == "gpus_allocated"]
    assert granted == [[f"nvidia.com/gpu={i}" for i in (1, 2, 3)]] * 2  # run, then restore
    after_start, after_restore = [e for e in lines if e["type"] == "gpus_verified"]
    assert after_start["message"] == after_restore["message"]
    (restored,) = [e for e in lines if e["type"] == "restored"]
    # trainer: 2 GPU nodes and the 3 control nodes; infer: 1 and 3; side: none.
    assert restored["devices"] == (2 + 3) + (1 + 3) + 0
    uuid = {i: nvidia_ctk.gpu_uuid(four_gpus.root, i) for i in range(4)}
    assert after_start["message"] == (
        f"each container sees exactly its own: trainer {uuid[1]}, {uuid[2]}; "
        f"infer {uuid[3]}; side none"
    )


def test_without_any_request_every_app_container_gets_all_gpus(
    four_gpus: node_.SimulatedNode, runc_path: str, tmp_path: Path
) -> None:
    """The seed PR's rule stands when no container names a GPU: all four in each."""
    bundle, lines = _run(four_gpus, tmp_path, {}, runc_path)
    for name in APPS:
        seen = _seen(bundle, name)
        assert _allowed(seen) == [0, 1, 2, 3], name
        assert seen["smi"] == ["yes"]
    (registered,) = [e for e in lines if e["type"] == "actor_registered"]
    assert registered["container_gpus"] == {}
