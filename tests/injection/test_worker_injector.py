"""The node agent's per-worker injector (the lifecycle's GPU injection effect)."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest
from support.gpu_nodes import injection_options, toolkit_config
from support.real import missing

from substrate_gpu.exceptions import DeviceRequestError
from substrate_gpu.injection import bundle as bundle_
from substrate_gpu.injection import injector as injector_
from substrate_gpu.injection import toolkit
from substrate_gpu.injection.injector import WorkerGpuInjector
from substrate_gpu.testing import bundles

pytestmark = pytest.mark.anyio


async def test_generates_once_and_injects_many_actors(gpu_node, tmp_path):
    """The spec is generated on first use; every actor gets the same devices."""
    generator = toolkit.CdiSpecGenerator(toolkit_config(gpu_node, tmp_path / "cdi"))
    injector = WorkerGpuInjector(
        generator=generator,
        options=injection_options(gpu_node),
    )
    counts = [
        await injector(bundles.make_bundle(tmp_path / f"actor{i}", ["true"])) for i in range(3)
    ]
    assert counts == [4, 4, 4]  # nvidia0 + nvidiactl + nvidia-uvm + nvidia-uvm-tools
    assert generator.cached is not None
    stats = injector.soname_cache.stats
    assert stats.misses == len(list(gpu_node.lib64.iterdir()))  # read once, then cached


def test_needs_exactly_one_spec_source(gpu_node):
    """A spec and a generator together (or neither) is a programming error."""
    with pytest.raises(ValueError, match="exactly one"):
        WorkerGpuInjector(options=bundle_.InjectionOptions())


async def test_skipped_hooks_are_counted_by_name(gpu_node, tmp_path):
    """Every hook left out of an injected bundle is counted under its bounded name."""
    from prometheus_client import CollectorRegistry

    from substrate_gpu.observability.metrics import AgentMetrics

    registry = CollectorRegistry()
    injector = WorkerGpuInjector(
        generator=toolkit.CdiSpecGenerator(toolkit_config(gpu_node, tmp_path / "cdi")),
        options=injection_options(gpu_node),
        metrics=AgentMetrics(registry),
    )
    bundle = bundles.make_bundle(tmp_path / "actor", ["true"])
    await injector(bundle)
    await injector(bundle)  # already injected: nothing skipped again

    def skipped(hook: str) -> float:
        return (
            registry.get_sample_value("substrate_gpu_injection_hooks_skipped_total", {"hook": hook})
            or 0.0
        )

    assert skipped("update-ldcache") == 1.0
    assert skipped("disable-device-node-modification") == 1.0
    assert skipped("update-application-profile") == 1.0


def claim_spec(name: str) -> str:
    """A DRA-driver-style per-claim spec granting /dev/nvidia0 under a claim name."""
    return json.dumps(
        {
            "cdiVersion": "0.5.0",
            "kind": "k8s.gpu.nvidia.com/claim",
            "devices": [
                {"name": name, "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0"}]}}
            ],
        }
    )


@pytest.fixture
def dra_injector(gpu_node, tmp_path):
    """An injector whose spec dirs receive per-claim specs while it runs."""
    spec_dir = tmp_path / "run-cdi"
    spec_dir.mkdir()
    injector = WorkerGpuInjector(
        generator=toolkit.CdiSpecGenerator(toolkit_config(gpu_node, tmp_path / "cdi")),
        options=injection_options(gpu_node),
        spec_dirs=[spec_dir],
    )
    return injector, spec_dir


async def test_a_claim_spec_written_later_is_found(dra_injector, tmp_path):
    """A DRA claim's spec appearing in the CDI dir after start is resolved on the next request."""
    injector, spec_dir = dra_injector
    bundle = bundles.make_bundle(tmp_path / "actor", ["true"])
    with pytest.raises(DeviceRequestError, match="no spec defines kind k8s.gpu.nvidia.com/claim"):
        await injector.inject(bundle, devices=["k8s.gpu.nvidia.com/claim=abc-gpu-0"])
    (spec_dir / "claim-abc.json").write_text(claim_spec("abc-gpu-0"))
    report = await injector.inject(bundle, devices=["k8s.gpu.nvidia.com/claim=abc-gpu-0"])
    assert report.outcome == "injected"
    assert [d.path for d in report.devices] == ["/dev/nvidia0"]


async def test_named_edits_are_reused_while_the_specs_are_unchanged(dra_injector):
    """The same request against unchanged spec files resolves once."""
    injector, spec_dir = dra_injector
    (spec_dir / "claim-abc.json").write_text(claim_spec("abc-gpu-0"))
    first = await injector.edits_for(["nvidia.com/gpu=0", "k8s.gpu.nvidia.com/claim=abc-gpu-0"])
    again = await injector.edits_for(["nvidia.com/gpu=0", "k8s.gpu.nvidia.com/claim=abc-gpu-0"])
    assert again is first


@pytest.fixture
def where_injected(monkeypatch):
    """The name of the thread each injection ran in, in order (the real injection runs)."""
    names: list[str] = []
    real = bundle_.inject_gpu

    def recording(*args, **kwargs):
        names.append(threading.current_thread().name)
        return real(*args, **kwargs)

    monkeypatch.setattr(bundle_, "inject_gpu", recording)
    return names


@pytest.mark.parametrize(
    ("memory_backed", "expected"),
    [
        # The first injection reads the host's libraries; later ones touch only memory.
        pytest.param(True, ["substrate-gpu inject", "MainThread", "MainThread"], id="tmpfs"),
        # fsyncs wait on the device, and a network mount may hang: always in a thread.
        pytest.param(False, ["substrate-gpu inject"] * 3, id="device-backed"),
    ],
)
async def test_the_thread_hop_only_where_the_work_can_block(
    gpu_node, node_spec, tmp_path, monkeypatch, where_injected, memory_backed, expected
):
    """Injections hop to an abandonable thread unless the libraries' SONAMEs are cached and
    the bundle lies on a memory-backed filesystem; both ways inject the same."""
    monkeypatch.setattr(injector_, "_on_memory_filesystem", lambda device: memory_backed)
    injector = WorkerGpuInjector(spec=node_spec, options=injection_options(gpu_node))
    for i in range(3):
        assert await injector(bundles.make_bundle(tmp_path / f"actor{i}", ["true"])) == 4
    assert where_injected == expected
    configs = [json.loads((tmp_path / f"actor{i}" / "config.json").read_text()) for i in range(3)]
    assert configs[0]["linux"]["devices"] == configs[2]["linux"]["devices"]


async def test_always_in_thread_keeps_the_old_hop(gpu_node, node_spec, tmp_path, where_injected):
    """``always_in_thread`` (the benchmark's "before") hops for every injection."""
    injector = WorkerGpuInjector(spec=node_spec, options=injection_options(gpu_node))
    injector.always_in_thread = True
    for i in range(2):
        await injector(bundles.make_bundle(tmp_path / f"actor{i}", ["true"]))
    assert where_injected == ["substrate-gpu inject"] * 2


@pytest.mark.parametrize(
    ("fstype", "memory"),
    [
        pytest.param("tmpfs", True, id="tmpfs"),
        pytest.param("ramfs", True, id="ramfs"),
        pytest.param("ext4", False, id="ext4"),
        pytest.param("nfs4", False, id="nfs"),
    ],
)
def test_the_mount_table_says_which_filesystems_are_memory(tmp_path, fstype, memory):
    """mountinfo's ``major:minor`` field names the mount; its type follows `` - ``; a
    device the table does not list is taken as device-backed."""
    table = tmp_path / "mountinfo"
    table.write_text(
        "22 1 0:21 / /proc rw,nosuid - proc proc rw\n"
        f"30 1 0:44 / /run/containerd rw,nosuid shared:9 - {fstype} none rw,size=1g\n"
    )
    assert injector_._on_memory_filesystem(os.makedev(0, 44), table) is memory
    assert injector_._on_memory_filesystem(os.makedev(0, 45), table) is False


def test_dev_shm_is_found_memory_backed_on_this_host():
    """The real mount table: /dev/shm (a tmpfs here) is memory-backed, / is not."""
    shm = Path("/dev/shm")
    types = {
        line.split()[1]: line.split()[2] for line in Path("/proc/mounts").read_text().splitlines()
    }
    if types.get(str(shm)) != "tmpfs" or types.get("/") in injector_.MEMORY_FILESYSTEMS:
        missing("a tmpfs at /dev/shm and a device-backed /", "is not what this host mounts")
    assert injector_._on_memory_filesystem(shm.stat().st_dev) is True
    assert injector_._on_memory_filesystem(Path("/").stat().st_dev) is False
