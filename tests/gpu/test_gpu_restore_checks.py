"""On a real GPU (issue 26 items 1, 2, 3, 6): what the restore checks read from the real
driver tools, and cuda-checkpoint's restore with a device map on a real CUDA process.

Without runsc's nvproxy on the machine these run the tools on the host, as the sandbox would
through ``runsc exec`` (:class:`HostExec` stands for the exec): the parsing, the UUIDs and the
driver's own answers are what is proven; gVisor's part stays unproven (docs/gpu-suspend.md).
"""

from __future__ import annotations

import ctypes.util
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator, Sequence
from pathlib import Path

import anyio
import pytest
from support import real
from support.gpu_hardware import keep

from substrate_gpu import _process, cudackpt, preflight
from substrate_gpu.lifecycle import gpu

pytestmark = pytest.mark.gpu

#: Holds a CUDA context with ``MIB`` MiB of device memory until stdin closes.
MIB = 512
HOLDER = textwrap.dedent(
    f"""
    import ctypes, sys
    cuda = ctypes.CDLL("libcuda.so.1")
    assert cuda.cuInit(0) == 0, "cuInit"
    dev = ctypes.c_int()
    assert cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0, "cuDeviceGet"
    ctx = ctypes.c_void_p()
    create = getattr(cuda, "cuCtxCreate_v2", None) or cuda.cuCtxCreate
    assert create(ctypes.byref(ctx), 0, dev) == 0, "cuCtxCreate"
    ptr = ctypes.c_uint64()
    assert cuda.cuMemAlloc_v2(ctypes.byref(ptr), {MIB} << 20) == 0, "cuMemAlloc"
    print("ready", flush=True)
    sys.stdin.readline()
    """
)


def tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        real.gpu_missing(f"{name} is not installed")
    return path


@pytest.fixture
def holder() -> Iterator[subprocess.Popen[str]]:
    if ctypes.util.find_library("cuda") is None:
        real.gpu_missing("libcuda is not installed")
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    yield proc
    assert proc.stdin is not None
    proc.stdin.close()
    proc.wait(timeout=60)


class HostExec:
    """``runsc exec`` stood in by running the command on the host (no sandbox here)."""

    async def exec(
        self, container_id: str, argv: Sequence[str], timeout: float | None = None
    ) -> _process.CommandResult:
        return await _process.run_command(
            argv, timeout=timeout or 300, what=f"running {argv[0]}", check=False
        )


def host_uuids() -> tuple[str, ...]:
    return tuple(g.uuid for g in preflight.read_gpu_identities())


def test_nvidia_smi_memory_query_lists_every_gpu_with_numbers(findings) -> None:
    """Item 3: the query the manifest and the restore check run answers every GPU the
    driver lists, in MiB, used + free within the GPU's memory."""
    memory = anyio.run(lambda: preflight.read_gpu_memory(tool("nvidia-smi")))
    keep(findings, "nvidia-smi-memory", [[m.uuid, m.used_mib, m.free_mib] for m in memory])
    assert sorted(m.uuid for m in memory) == sorted(host_uuids())
    for m in memory:
        assert m.used_mib is not None and m.free_mib is not None
        assert m.free_mib > 0


def test_a_cuda_allocation_shows_as_used_memory(holder) -> None:
    """Item 3: memory.used counts a process's device allocation (what a checkpoint records)."""
    smi = tool("nvidia-smi")
    with_holder = anyio.run(lambda: preflight.read_gpu_memory(smi))
    assert max(m.used_mib or 0 for m in with_holder) >= MIB


def test_nvidia_smi_list_gives_the_drivers_uuids(findings) -> None:
    """Item 6: ``nvidia-smi -L`` (what verify runs in the sandbox) parses to exactly the
    UUIDs /proc/driver/nvidia/gpus has (what the actor's own GPUs resolve to)."""
    listing = subprocess.run(
        [tool("nvidia-smi"), "-L"], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    keep(findings, "nvidia-smi-L-uuids", list(preflight.parse_gpu_list(listing)))
    gpus = [u for u in preflight.parse_gpu_list(listing) if u.startswith("GPU-")]
    assert sorted(gpus) == sorted(host_uuids())


def _driver() -> str:
    version = preflight.read_proc_version()
    if version is None:
        real.gpu_missing("no /proc/driver/nvidia/version")
    return version


def test_cuda_checkpoint_offers_a_device_map_from_580(findings) -> None:
    """Item 1: the real tool's --help names --device-map exactly when the driver is 580+ (the
    stand-in's model and check_remap's rule)."""
    text = subprocess.run(
        [tool("cuda-checkpoint"), "--help"],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    keep(findings, "cuda-checkpoint-help", text.splitlines())
    has = "--device-map" in text
    assert has == (preflight.major_of(_driver()) >= preflight.CUDA_CHECKPOINT_DEVICE_MAP_MIN_DRIVER)


def test_a_restore_with_a_device_map_reads_running_after_unlock(holder, findings) -> None:
    """Items 1 and 2: lock, checkpoint, then our resume with a device map (the GPU onto
    itself: a one-GPU machine has no other) through the exec tool; the process reads
    'running' afterwards, and its memory is back on the GPU."""
    if preflight.major_of(_driver()) < preflight.CUDA_CHECKPOINT_DEVICE_MAP_MIN_DRIVER:
        real.gpu_missing("driver older than 580: no --device-map")
    uuids = host_uuids()
    device_map = ",".join(f"{u}={u}" for u in uuids)
    exec_tool = cudackpt.ExecCudaCheckpoint(HostExec(), "host", tool_path=tool("cuda-checkpoint"))

    async def cycle() -> tuple[str, str]:
        suspended = await cudackpt.suspend_processes(exec_tool, [holder.pid])
        assert suspended.suspended, suspended.reason
        checkpointed = await exec_tool.get_state(holder.pid)
        resumed = await cudackpt.resume_processes(exec_tool, [holder.pid], device_map=device_map)
        assert resumed.ok, resumed.reason
        return checkpointed, await exec_tool.get_state(holder.pid)

    states = anyio.run(cycle)
    keep(findings, "cuda-checkpoint-device-map-cycle", {"map": device_map, "states": states})
    assert states == ("checkpointed", "running")


def test_a_device_map_missing_a_gpu_is_refused_by_the_driver(holder) -> None:
    """Item 1: a map that does not name the checkpointed GPU fails the restore and leaves
    the process checkpointed (what the stand-in models); it is then restored properly."""
    if preflight.major_of(_driver()) < preflight.CUDA_CHECKPOINT_DEVICE_MAP_MIN_DRIVER:
        real.gpu_missing("driver older than 580: no --device-map")
    ckpt, pid = tool("cuda-checkpoint"), str(holder.pid)
    for action in ("lock", "checkpoint"):
        subprocess.run([ckpt, "--action", action, "--pid", pid], check=True, timeout=300)
    bogus = "GPU-00000000-0000-0000-0000-000000000000"
    out = subprocess.run(
        [ckpt, "--action", "restore", "--pid", pid, "--device-map", f"{bogus}={bogus}"],
        check=False, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    state = subprocess.run(
        [ckpt, "--get-state", "--pid", pid],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout.strip()
    for action in ("restore", "unlock"):
        subprocess.run([ckpt, "--action", action, "--pid", pid], check=False, timeout=300)
    assert out.returncode != 0, out.stdout
    assert state == "checkpointed"


def test_the_checkpoint_manifest_records_this_hosts_gpus_with_memory(tmp_path: Path) -> None:
    """Items 1 and 3 together: the actor's GPUs as the node resolves them (every GPU here)
    with memory read now, written and read back as schema 4."""
    settings = gpu.GpuSettings(drivers=None, nvidia_smi=tool("nvidia-smi"))  # type: ignore[arg-type]
    uuids = gpu.own_gpu_uuids(settings, None, "")
    assert uuids == host_uuids() and uuids
    held = anyio.run(lambda: gpu.gpus_now(settings, uuids))
    manifest = preflight.CheckpointManifest(
        driver_version=_driver(), gpu_count=len(held), cuda_state_included=False, actor_gpus=held
    )
    preflight.write_manifest(tmp_path, manifest)
    back = preflight.read_manifest(tmp_path)
    assert back is not None and back.actor_gpus == held
    assert all(g.memory_used_mib is not None for g in held)
