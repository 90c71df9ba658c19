"""End to end: a generated spec injected into a bundle that really runs in runc.

Every check is made *inside* the container, i.e. what an actor would see: device nodes
with the host's numbers, the cgroup letting injected nodes through (ENXIO: no driver
behind major 195 on this machine) while denying others (EPERM), read-only library mounts,
``libcuda.so.1`` resolving through the staged SONAME link via ``LD_LIBRARY_PATH``, the env,
and the allowlisted hooks having run.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from support import runc_bundle
from support.gpu_nodes import generate_spec, injection_options

from substrate_gpu import cdi
from substrate_gpu.injection import bundle as bundle_
from substrate_gpu.rootfs import SonameCache
from substrate_gpu.testing import bundles
from substrate_gpu.testing import node as node_

pytestmark = pytest.mark.runc

DLCHECK_C = r"""
#include <dlfcn.h>
#include <stdio.h>
int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        void *h = dlopen(argv[i], RTLD_NOW);
        if (!h) { printf("dlopen %s FAIL %s\n", argv[i], dlerror()); continue; }
        const char *(*f)(void) = (const char *(*)(void))dlsym(h, "substrate_gpu_sim_library");
        printf("dlopen %s OK %s\n", argv[i], f ? f() : "no-symbol");
    }
    return 0;
}
"""

ACTOR_SCRIPT = r"""
for d in $NODES; do echo "node $d $(stat -c '%F %t %T' $d 2>&1)"; done
for d in $OPEN; do
  if ( : < $d ) 2>/tmp/err; then echo "open $d ok"; else echo "open $d $(cat /tmp/err)"; fi
done
grep -F "$LIBDIR" /proc/mounts | while read -r src dst fs opts rest; do
  echo "mount $dst $opts"
done
env | sort | sed 's/^/env /'
echo "link libcuda.so.1 $(readlink "$LIBDIR/libcuda.so.1")"
echo "link libcuda.so $(readlink "$LIBDIR/libcuda.so")"
/dlcheck libcuda.so.1 libnvidia-ml.so.1
"""


def _copy_loader_and_libc(binary: Path, rootfs: Path) -> None:
    """Put the dynamic loader and libc the checker needs into the rootfs."""
    out = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, check=True).stdout
    for path in re.findall(r"(/\S+)\s+\(0x", out):
        src = Path(path).resolve()
        for dest in {Path(path), Path(path).parent / src.name}:
            target = rootfs / dest.relative_to("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            if not target.exists():
                shutil.copy2(src, target)


def make_actor_bundle(
    directory: Path, *, env: list[str], nodes: list[str], opens: list[str], libdir: str
) -> Path:
    bundle = bundles.make_bundle(
        directory,
        ["sh", "-c", ACTOR_SCRIPT],
        env=[*env, f"NODES={' '.join(nodes)}", f"OPEN={' '.join(opens)}", f"LIBDIR={libdir}"],
    )
    rootfs = bundle / "rootfs"
    source = directory / "dlcheck.c"
    source.write_text(DLCHECK_C)
    subprocess.run(["gcc", "-o", str(rootfs / "dlcheck"), str(source)], check=True)
    _copy_loader_and_libc(rootfs / "dlcheck", rootfs)
    return bundle


@pytest.fixture(scope="module")
def actor_run(gpu_node, node_edits, runc_path, tmp_path_factory):
    """Inject into a bundle whose image sets NVIDIA_VISIBLE_DEVICES and LD_LIBRARY_PATH, run it."""
    work = tmp_path_factory.mktemp("actor")
    libdir = str(gpu_node.lib64)
    bundle = make_actor_bundle(
        work / "bundle",
        env=[
            "PATH=/bin",
            "NVIDIA_VISIBLE_DEVICES=all",
            "LD_LIBRARY_PATH=/opt/app/lib",
        ],
        nodes=["/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"],
        opens=["/dev/nvidia0", "/dev/nvidiactl", "/denied/nvidia9"],
        libdir=libdir,
    )
    denied = bundle / "rootfs/denied"
    denied.mkdir()
    subprocess.run(["mknod", str(denied / "nvidia9"), "c", "195", "9"], check=True)
    gpu_node.hook_log.unlink(missing_ok=True)
    report = bundle_.inject_gpu(
        bundle,
        node_edits,
        options=injection_options(gpu_node),
        soname_cache=SonameCache(),
    )
    assert report.outcome == "injected"
    config = json.loads((bundle / "config.json").read_text())
    lines = runc_bundle.run_to_completion(runc_path, bundle, work / "runc-state")
    hooks = [json.loads(line) for line in gpu_node.hook_log.read_text().splitlines()]
    return lines, config, hooks, libdir


def test_device_nodes_have_the_host_numbers(actor_run):
    """Injected nodes exist in the actor as char devices with the host's major:minor."""
    lines, *_ = actor_run
    assert sorted(runc_bundle.lines_with("node", lines)) == [
        "/dev/nvidia-uvm character special file eb 0",
        "/dev/nvidia-uvm-tools character special file eb 1",
        "/dev/nvidia0 character special file c3 0",
        "/dev/nvidiactl character special file c3 ff",
    ]


def test_injected_node_passes_the_cgroup(actor_run):
    """Opening an injected node reaches the (absent) driver: ENXIO, not EPERM."""
    lines, *_ = actor_run
    opened = dict(line.split(" ", 1) for line in runc_bundle.lines_with("open", lines))
    assert "No such device or address" in opened["/dev/nvidia0"]
    assert "No such device or address" in opened["/dev/nvidiactl"]


def test_node_outside_the_allow_list_is_denied(actor_run):
    """A GPU node the spec did not grant is refused by the device cgroup (EPERM)."""
    lines, *_ = actor_run
    opened = dict(line.split(" ", 1) for line in runc_bundle.lines_with("open", lines))
    assert "Operation not permitted" in opened["/denied/nvidia9"]


def test_libraries_are_mounted_read_only(actor_run):
    """Every driver library mount in the actor is read-only."""
    lines, _, _, libdir = actor_run
    mounts = runc_bundle.lines_with("mount", lines)
    assert len(mounts) == len(node_.DEFAULT_LIBRARIES)
    for mount in mounts:
        destination, options = mount.split(" ")
        assert destination.startswith(libdir)
        assert "ro" in options.split(","), mount


def test_soname_resolves_through_the_staged_link(actor_run):
    """dlopen("libcuda.so.1") finds the driver library via LD_LIBRARY_PATH and our link."""
    lines, *_ = actor_run
    assert "libcuda.so.1 libcuda.so.580.65.06" in runc_bundle.lines_with("link", lines)
    assert runc_bundle.lines_with("dlopen", lines) == [
        "libcuda.so.1 OK libcuda.so.1",
        "libnvidia-ml.so.1 OK libnvidia-ml.so.1",
    ]


def test_env_is_exactly_as_specified(actor_run):
    """NVIDIA_VISIBLE_DEVICES is gone, the CDI env is added, LD_LIBRARY_PATH is prepended once."""
    lines, config, _, libdir = actor_run
    assert config["process"]["env"][:1] == ["PATH=/bin"]
    assert [
        e for e in config["process"]["env"] if not e.startswith(("NODES=", "OPEN=", "LIBDIR="))
    ] == [
        "PATH=/bin",
        f"NVIDIA_CTK_LIBCUDA_DIR={libdir}",
        f"LD_LIBRARY_PATH={libdir}:/opt/app/lib",
    ]
    env = runc_bundle.lines_with("env", lines)
    assert not [e for e in env if e.startswith("NVIDIA_VISIBLE_DEVICES=")]
    assert [e for e in env if e.startswith("LD_LIBRARY_PATH=")] == [
        f"LD_LIBRARY_PATH={libdir}:/opt/app/lib"
    ]


def test_allowlisted_hooks_ran_and_others_did_not(actor_run):
    """create-symlinks and enable-cuda-compat ran (from the mounted toolkit); nothing else did."""
    lines, config, hooks, _ = actor_run
    assert [h["argv"][1] for h in hooks] == ["create-symlinks", "enable-cuda-compat"]
    assert all(h["argv"][0].endswith("/opt/nvidia-toolkit/nvidia-cdi-hook.real") for h in hooks)
    # create-symlinks really created its link inside the actor's root.
    assert "libcuda.so libcuda.so.1" in runc_bundle.lines_with("link", lines)
    assert len(config["hooks"]["createContainer"]) == 2


@pytest.mark.parametrize(
    ("held", "absent"),
    [
        pytest.param((0, 1), (2, 3), id="worker-a-holds-nvidia0-1"),
        pytest.param((2, 3), (0, 1), id="worker-b-holds-nvidia2-3"),
    ],
)
def test_multi_gpu_worker_gets_exactly_its_own_devices(held, absent, gpu_node, runc_path, tmp_path):
    """On a 4-GPU node, each worker's actor sees exactly the GPUs its pod holds."""
    worker = tmp_path / "worker"
    (worker / "dev").mkdir(parents=True)
    for index in held:
        subprocess.run(
            ["mknod", str(worker / f"dev/nvidia{index}"), "c", "195", str(index)], check=True
        )
    for name, major, minor in (("nvidiactl", 195, 255), ("nvidia-uvm", 235, 0)):
        subprocess.run(
            ["mknod", str(worker / f"dev/{name}"), "c", str(major), str(minor)], check=True
        )
    # The worker's view shares the node's driver and toolkit.
    view = node_.SimulatedNode(
        root=worker,
        driver_root=gpu_node.driver_root,
        toolkit_dir=gpu_node.toolkit_dir,
        gpus=held,
        driver_version=gpu_node.driver_version,
        real_device_nodes=True,
    )
    edits = cdi.edits_for_all(generate_spec(view, tmp_path / "cdi"))
    all_gpus = [f"/dev/nvidia{i}" for i in (*held, *absent)]
    bundle = bundles.make_bundle(
        tmp_path / "bundle",
        [
            "sh",
            "-c",
            "ls /dev | grep '^nvidia[0-9]'; for d in "
            + " ".join(all_gpus)
            + '; do if ( : < $d ) 2>/dev/null; then :; else echo "open $d $?"; fi; done',
        ],
    )
    bundle_.inject_gpu(
        bundle,
        edits,
        options=bundle_.InjectionOptions(
            driver_root=str(view.driver_root), dev_root=worker, toolkit_dir=view.toolkit_dir
        ),
        soname_cache=SonameCache(),
    )
    config = json.loads((bundle / "config.json").read_text())
    rules = {
        (r["major"], r["minor"]) for r in config["linux"]["resources"]["devices"] if r.get("allow")
    }
    assert {(195, i) for i in held} <= rules
    assert not {(195, i) for i in absent} & rules
    lines = runc_bundle.run_to_completion(runc_path, bundle, tmp_path / "runc-state")
    assert [line for line in lines if not line.startswith("open")] == [f"nvidia{i}" for i in held]


def test_a_node_with_no_permissions_exists_but_cannot_be_opened(
    gpu_node, node_edits, runc_path, tmp_path
):
    """CDI ``permissions: none`` (reference v1.1.1+): the node is in the actor's /dev and no
    cgroup rule grants it, so runc denies opening it (EPERM) while a node with the default
    ``rwm`` reaches the absent driver (ENXIO). (The reference writes an allow rule with empty
    access instead, which runc 1.1.5 refuses to start: "device access … cannot be empty".)"""
    nodes = tuple(
        dataclasses.replace(n, permissions=cdi.NO_PERMISSIONS) if n.path == "/dev/nvidia0" else n
        for n in node_edits.device_nodes
    )
    edits = dataclasses.replace(node_edits, device_nodes=nodes)
    script = 'for d in /dev/nvidia0 /dev/nvidiactl; do ( : < $d ) 2>&1 | sed "s|^|$d |"; done'
    bundle = bundles.make_bundle(tmp_path / "bundle", ["sh", "-c", script])
    bundle_.inject_gpu(
        bundle, edits, options=injection_options(gpu_node), soname_cache=SonameCache()
    )
    config = json.loads((bundle / "config.json").read_text())
    granted = {(r.get("major"), r.get("minor")) for r in config["linux"]["resources"]["devices"]}
    assert (195, 0) not in granted
    assert (195, 255) in granted
    lines = runc_bundle.run_to_completion(runc_path, bundle, tmp_path / "runc-state")
    out = dict(line.split(" ", 1) for line in lines if line.startswith("/dev/"))
    assert "Operation not permitted" in out["/dev/nvidia0"]
    assert "No such device or address" in out["/dev/nvidiactl"]


def test_a_toolkit_1_20_2_spec_runs_in_runc_with_its_void_mount_and_no_memory_hook(
    gpu_node, runc_path, tmp_path
):
    """The 1.20.2 shape end to end: the createRuntime apply-cuda-memory-limits hook is not in
    the bundle (no host-side NVML call), the void mount device is a read-only /dev/null in
    the actor, and the GPU still passes the cgroup (ENXIO: no driver behind it here)."""
    spec = generate_spec(gpu_node, tmp_path / "cdi", toolkit_version="1.20.2")
    gpu = next(d for d in spec.devices if d.name == "all")
    assert [h.args[1] for h in gpu.container_edits.hooks] == ["apply-cuda-memory-limits"]
    script = (
        "v=/var/run/nvidia-container-devices/void; stat -c '%F %t %T' $v;"
        " grep \" $v \" /proc/mounts | cut -d' ' -f4 | tr , '\\n' | grep -x ro;"
        " ( : < /dev/nvidia0 ) 2>&1; true"
    )
    bundle = bundles.make_bundle(tmp_path / "bundle", ["sh", "-c", script])
    report = bundle_.inject_gpu(
        bundle,
        cdi.edits_for_all(spec),
        options=injection_options(gpu_node),
        soname_cache=SonameCache(),
    )
    assert "apply-cuda-memory-limits" in report.hooks_skipped
    config = json.loads((bundle / "config.json").read_text())
    argvs = [h["args"] for point in config.get("hooks", {}).values() for h in point]
    assert not [a for a in argvs if "apply-cuda-memory-limits" in a]
    lines = runc_bundle.run_to_completion(runc_path, bundle, tmp_path / "runc-state")
    assert lines[0] == "character special file 1 3"
    assert lines[1] == "ro"
    assert "No such device or address" in lines[2]
