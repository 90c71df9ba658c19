"""Named GPUs proven in real runc: on a simulated 4-GPU node, an actor given GPU 2 gets GPU 2.

The node's device nodes are real char devices with NVIDIA's numbers (mknod, 195:N), so
inside the container opening a node the cgroup allows fails with ENXIO (no driver behind
major 195 on this machine), and a node it does not allow fails with EPERM. The other GPUs'
nodes are made inside the actor's rootfs too (an image could carry them), so the only thing
standing between the actor and GPUs 0, 1, 3 is the cgroup rule we did not write.
The spec comes from the production generation path (toolkit stand-in), the injection from
the per-worker injector the lifecycle calls, with ``devices=["nvidia.com/gpu=2"]``.
"""

from __future__ import annotations

import json
import subprocess

import anyio
import pytest
from support import runc_bundle
from support.gpu_nodes import injection_options, toolkit_config

from substrate_gpu import cdi, exceptions
from substrate_gpu.injection import toolkit
from substrate_gpu.injection.injector import WorkerGpuInjector
from substrate_gpu.testing import bundles
from substrate_gpu.testing import node as node_

pytestmark = pytest.mark.runc

PROBE = r"""
ls /dev | grep '^nvidia' | sed 's/^/dev /'
for d in /dev/nvidia2 /dev/nvidiactl /other/nvidia0 /other/nvidia1 /other/nvidia3; do
  if ( : < $d ) 2>/tmp/err; then echo "open $d ok"; else echo "open $d $(cat /tmp/err)"; fi
done
"""


@pytest.fixture(scope="module")
def four_gpu_worker(require_root, tmp_path_factory):
    """A 4-GPU node (real 195:N nodes) and a worker injector generating its spec."""
    work = tmp_path_factory.mktemp("four-gpus")
    sim = node_.build_node(work / "root", gpus=(0, 1, 2, 3), real_device_nodes=True)
    injector = WorkerGpuInjector(
        generator=toolkit.CdiSpecGenerator(toolkit_config(sim, work / "cdi")),
        options=injection_options(sim),
    )
    return sim, injector


def actor_bundle(directory):
    bundle = bundles.make_bundle(directory, ["sh", "-c", PROBE])
    other = bundle / "rootfs/other"
    other.mkdir()
    for index in (0, 1, 3):
        subprocess.run(["mknod", str(other / f"nvidia{index}"), "c", "195", str(index)], check=True)
    return bundle


@pytest.fixture(scope="module")
def gpu2_actor(four_gpu_worker, runc_path, tmp_path_factory):
    """An actor given nvidia.com/gpu=2, run in runc: its config and what it saw."""
    _, injector = four_gpu_worker
    work = tmp_path_factory.mktemp("gpu2")
    bundle = actor_bundle(work / "bundle")
    report = anyio.run(lambda: injector.inject(bundle, devices=["nvidia.com/gpu=2"]))
    assert report.outcome == "injected"
    config = json.loads((bundle / "config.json").read_text())
    return config, runc_bundle.run_to_completion(runc_path, bundle, work / "runc-state")


def test_only_gpu_2_is_in_the_actor(gpu2_actor):
    """/dev holds nvidia2 and the control nodes, no other GPU."""
    _, lines = gpu2_actor
    assert sorted(runc_bundle.lines_with("dev", lines)) == [
        "nvidia-uvm",
        "nvidia-uvm-tools",
        "nvidia2",
        "nvidiactl",
    ]


def test_gpu_2_passes_the_cgroup(gpu2_actor):
    """Opening /dev/nvidia2 (and nvidiactl) reaches the absent driver: ENXIO, not EPERM."""
    _, lines = gpu2_actor
    opened = dict(line.split(" ", 1) for line in runc_bundle.lines_with("open", lines))
    assert "No such device or address" in opened["/dev/nvidia2"]
    assert "No such device or address" in opened["/dev/nvidiactl"]


@pytest.mark.parametrize("index", [0, 1, 3])
def test_other_gpus_are_denied_by_the_cgroup(gpu2_actor, index):
    """The other GPUs' nodes, present in the rootfs, are refused by the device cgroup (EPERM)."""
    _, lines = gpu2_actor
    opened = dict(line.split(" ", 1) for line in runc_bundle.lines_with("open", lines))
    assert "Operation not permitted" in opened[f"/other/nvidia{index}"]


def test_cgroup_rules_cover_gpu_2_and_the_control_nodes_only(gpu2_actor):
    """The allow rules are exactly GPU 2's and the spec-level control nodes'."""
    config, _ = gpu2_actor
    allowed = sorted(
        (r["major"], r["minor"]) for r in config["linux"]["resources"]["devices"] if r.get("allow")
    )
    assert allowed == [(195, 2), (195, 255), (node_.UVM_MAJOR, 0), (node_.UVM_MAJOR, 1)]


def test_same_gpu_by_uuid_gives_the_same_config(four_gpu_worker, gpu2_actor, tmp_path):
    """Requesting GPU 2 by its UUID writes the same config.json as by its index."""
    _, injector = four_gpu_worker
    (gpu2,) = [g for g in cdi.list_gpus(anyio.run(injector.spec_set)) if g.index == 2]
    bundle = actor_bundle(tmp_path / "bundle")
    anyio.run(lambda: injector.inject(bundle, devices=[f"nvidia.com/gpu={gpu2.uuid}"]))
    config, _ = gpu2_actor
    assert json.loads((bundle / "config.json").read_text())["linux"] == config["linux"]


def test_unknown_gpu_leaves_the_bundle_untouched(four_gpu_worker, tmp_path):
    """nvidia.com/gpu=7 on a 4-GPU worker: a clear error, config.json byte-identical."""
    _, injector = four_gpu_worker
    bundle = actor_bundle(tmp_path / "bundle")
    before = (bundle / "config.json").read_bytes()
    with pytest.raises(exceptions.DeviceRequestError, match=r"nvidia.com/gpu=7.*offers: 0, GPU-"):
        anyio.run(lambda: injector.inject(bundle, devices=["nvidia.com/gpu=7"]))
    assert (bundle / "config.json").read_bytes() == before
    assert not (bundle / "rootfs/usr").exists()  # no SONAME link staged either


def test_second_injection_with_another_gpu_is_refused(four_gpu_worker, tmp_path):
    """A bundle holding GPU 2 cannot also be given GPU 1: refused, config unchanged."""
    _, injector = four_gpu_worker
    bundle = actor_bundle(tmp_path / "bundle")
    anyio.run(lambda: injector.inject(bundle, devices=["nvidia.com/gpu=2"]))
    before = (bundle / "config.json").read_bytes()
    with pytest.raises(exceptions.InjectionError, match="already holds /dev/nvidia2"):
        anyio.run(lambda: injector.inject(bundle, devices=["nvidia.com/gpu=1"]))
    assert (bundle / "config.json").read_bytes() == before
    again = anyio.run(lambda: injector.inject(bundle, devices=["nvidia.com/gpu=2"]))
    assert again.outcome == "already-injected"


def test_without_names_the_actor_gets_all_gpus(four_gpu_worker, tmp_path):
    """devices=None keeps today's behaviour: every GPU of the worker."""
    _, injector = four_gpu_worker
    bundle = actor_bundle(tmp_path / "bundle")
    report = anyio.run(lambda: injector.inject(bundle))
    assert sorted(d.path for d in report.devices if d.path[len("/dev/nvidia") :].isdigit()) == [
        f"/dev/nvidia{i}" for i in range(4)
    ]
