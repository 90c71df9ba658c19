"""On a real GPU: device numbers, per-device specs from nvidia-ctk, the agent's GPU discovery,
one GPU given by name in runc, SONAME staging, the fd probe against a real CUDA context.

Each test says what it checks against the real thing; all are marked ``gpu`` (see conftest),
and each keeps what it found (``findings``) when ``SUBSTRATE_GPU_FINDINGS`` is set.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import anyio
import pytest
from support import real
from support.gpu_hardware import gpu_present, keep

from substrate_gpu import cdi
from substrate_gpu.cdi import model
from substrate_gpu.injection import devices, toolkit
from substrate_gpu.probes import FdScanProbe
from substrate_gpu.rootfs import SonameCache, staging
from substrate_gpu.service import config as config_
from substrate_gpu.service import wiring
from substrate_gpu.testing import bundles

pytestmark = pytest.mark.gpu

NVIDIA_MAJOR = 195


def gpu_nodes() -> tuple[str, ...]:
    return devices.detect_gpus(Path("/"))


# --- device detection and numbers -----------------------------------------------------------


def test_every_gpu_node_resolves_to_195_and_its_index(findings):
    """/dev/nvidiaN is char 195:N on the host, as our resolution reads it."""
    nodes = gpu_nodes()
    assert nodes
    seen = {}
    for path in nodes:
        resolved = devices.resolve_device(model.DeviceNode(path), dev_root=Path("/"))
        seen[path] = [resolved.type, resolved.major, resolved.minor, resolved.file_mode]
        assert (resolved.type, resolved.major, resolved.minor) == (
            "c",
            NVIDIA_MAJOR,
            int(path[11:]),
        )
        assert resolved.file_mode is not None
    keep(findings, "device-nodes", seen)


def test_control_nodes_have_their_numbers():
    """nvidiactl is 195:255; nvidia-uvm (when loaded) a char device with a dynamic major."""
    ctl = devices.resolve_device(model.DeviceNode("/dev/nvidiactl"), dev_root=Path("/"))
    assert (ctl.type, ctl.major, ctl.minor) == ("c", NVIDIA_MAJOR, 255)
    if Path("/dev/nvidia-uvm").exists():
        uvm = devices.resolve_device(model.DeviceNode("/dev/nvidia-uvm"), dev_root=Path("/"))
        assert uvm.type == "c" and uvm.major not in (0, NVIDIA_MAJOR)


def test_detected_gpus_match_nvidia_smi(findings):
    """detect_gpus finds as many GPUs as nvidia-smi lists (when nvidia-smi is installed)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        real.gpu_missing("nvidia-smi is not installed")
    listed = subprocess.run([smi, "-L"], capture_output=True, text=True, check=True, timeout=60)
    gpus = [line for line in listed.stdout.splitlines() if line.startswith("GPU ")]
    keep(findings, "nvidia-smi-L", gpus)
    assert len(gpus) == len(gpu_nodes())


# --- per-device specs from the real nvidia-ctk ------------------------------------------------


@pytest.fixture(scope="module")
def real_spec(tmp_path_factory) -> cdi.Spec:
    """The spec the installed nvidia-ctk generates for this machine."""
    ctk = shutil.which("nvidia-ctk")
    if not gpu_present():
        real.gpu_missing("no NVIDIA GPU on this machine")
    if ctk is None:
        real.gpu_missing("nvidia-ctk is not installed")
    out = tmp_path_factory.mktemp("cdi") / "nvidia.json"
    subprocess.run(
        [ctk, "cdi", "generate", "--format=json", f"--output={out}"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    keep = os.environ.get("SUBSTRATE_GPU_FINDINGS")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy2(out, Path(keep) / "nvidia-ctk-generated.json")
    return cdi.load_spec(out, strict=False)


def test_real_spec_lists_every_gpu_once(real_spec, findings):
    """list_gpus finds one entry per /dev/nvidiaN, each with its index and UUID."""
    gpus = cdi.list_gpus(cdi.SpecSet([real_spec]))
    keep(findings, "listed-gpus", [[g.name, g.index, g.uuid, g.node, list(g.names)] for g in gpus])
    assert sorted(g.node for g in gpus) == sorted(gpu_nodes())
    for gpu in gpus:
        assert gpu.index is not None
        assert gpu.uuid is not None and gpu.uuid.startswith("GPU-")


def test_each_real_gpu_gets_only_its_own_node(real_spec):
    """Requesting one GPU by index or UUID yields its node and no other GPU's."""
    specs = cdi.SpecSet([real_spec])
    for gpu in cdi.list_gpus(specs):
        for name in (gpu.name, f"nvidia.com/gpu={gpu.uuid}"):
            edits = cdi.edits_for_devices(specs, [name])
            nodes = [n.path for n in edits.device_nodes if n.path[11:].isdigit()]
            assert nodes == [gpu.node], name


def test_real_all_device_still_resolves(real_spec):
    """The real spec's `all` merges with spec-level edits into device nodes (today's path)."""
    edits = cdi.edits_for_all(real_spec)
    assert sorted(n.path for n in edits.device_nodes if n.path[11:].isdigit()) == sorted(
        gpu_nodes()
    )


# --- the agent's view: its GPUs, and one GPU given to a container by name ----------------------


def toolkit_dir() -> Path:
    ctk = shutil.which("nvidia-ctk")
    if ctk is None:
        real.gpu_missing("nvidia-ctk is not installed")
    return Path(ctk).resolve().parent


def agent_config(tmp_path: Path) -> config_.AgentConfig:
    """The agent's configuration on this machine: its toolkit, its driver (default /usr)."""
    return config_.AgentConfig(
        toolkit_dir=toolkit_dir(),
        cdi_output_dir=tmp_path / "cdi",
        driver_root=Path(os.environ.get(toolkit.ENV_DRIVER_ROOT) or "/usr"),
    )


def test_the_agent_learns_the_real_workers_gpus(tmp_path, findings):
    """The agent's discovery (production generation path: our nvidia-ctk argv) lists every GPU."""
    config = agent_config(tmp_path)
    injector = wiring.build_injector(config)
    worker = anyio.run(wiring.gpu_discovery(config, injector))
    keep(findings, "agent-worker-gpus", list(worker.names))
    assert len(worker.names) == len(gpu_nodes())
    spec = anyio.run(injector.spec_set)
    assert sorted(g.node for g in cdi.list_gpus(spec)) == sorted(gpu_nodes())


OPEN_PROBE = r"""
for d in /dev/nvidiactl /other/*; do
  if ( : < $d ) 2>/tmp/err; then echo "open $d ok"; else echo "open $d $(cat /tmp/err)"; fi
done
"""


def test_a_gpu_given_by_name_is_the_only_one_a_container_can_open(tmp_path, runc_path, findings):
    """GPU 0 by name into a runc bundle: its node opens; every other GPU's node is EPERM."""
    injector = wiring.build_injector(agent_config(tmp_path))
    (first, *_) = cdi.list_gpus(anyio.run(injector.spec_set))
    bundle = bundles.make_bundle(tmp_path / "bundle", ["sh", "-c", OPEN_PROBE])
    other = bundle / "rootfs/other"
    other.mkdir()
    for node in gpu_nodes():  # every GPU's node in the rootfs: only the cgroup stands between
        st = os.stat(node)
        os.mknod(other / Path(node).name, st.st_mode, st.st_rdev)
    report = anyio.run(lambda: injector.inject(bundle, devices=[first.name]))
    assert report.outcome == "injected"
    raw = json.loads((bundle / "config.json").read_text())
    raw.pop("hooks", None)  # the toolkit's own hooks are not under test here: device access is
    (bundle / "config.json").write_text(json.dumps(raw))
    state = tmp_path / "runc-state"
    result = subprocess.run(
        [runc_path, "--root", str(state), "run", "--bundle", str(bundle), "sgpu-real-gpu"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    subprocess.run(
        [runc_path, "--root", str(state), "delete", "--force", "sgpu-real-gpu"], check=False
    )
    assert result.returncode == 0, result.stderr
    opened = dict(
        line.removeprefix("open ").split(" ", 1)
        for line in result.stdout.splitlines()
        if line.startswith("open ")
    )
    keep(findings, "runc-open-by-name", {"granted": first.name, "opened": opened})
    assert opened["/dev/nvidiactl"] == "ok"
    for node in gpu_nodes():
        seen = opened[f"/other/{Path(node).name}"]
        if node == first.node:
            assert seen == "ok", node
        else:
            assert "Operation not permitted" in seen, node


# --- SONAME staging on the real driver libraries ---------------------------------------------


def driver_libraries() -> list[Path]:
    """The installed driver's versioned libraries: the directory of libcuda.so.1."""
    listing = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, check=True)
    paths = [
        line.split(" => ")[-1].strip()
        for line in listing.stdout.splitlines()
        if line.strip().startswith("libcuda.so.1 ")
    ]
    if not paths:
        real.gpu_missing("libcuda.so.1 is not in the loader cache")
    directory = Path(paths[0]).resolve().parent
    return sorted(
        p
        for p in directory.iterdir()
        if ".so." in p.name and p.is_file() and p.name.startswith(("libcuda", "libnvidia"))
    )


def test_staged_links_equal_ldconfig_on_the_real_driver(tmp_path, findings):
    """Our SONAME links for the real driver libraries are exactly ldconfig -n's."""
    libraries = driver_libraries()
    assert libraries
    copy_dir = tmp_path / "ldconfig"
    copy_dir.mkdir()
    for lib in libraries:
        shutil.copy2(lib, copy_dir / lib.name)
    subprocess.run(["ldconfig", "-n", str(copy_dir)], check=True)
    expected = {p.name: os.readlink(p) for p in copy_dir.iterdir() if p.is_symlink()}

    rootfs = tmp_path / "rootfs"
    rootfs.mkdir()
    libdir = "/usr/lib/x86_64-linux-gnu"
    report = staging.stage_soname_links(
        rootfs, [(lib, f"{libdir}/{lib.name}") for lib in libraries], cache=SonameCache()
    )
    ours = {Path(link.link).name: link.target for link in report.created}
    assert ours == expected
    assert "libcuda.so.1" in ours
    if findings is not None:
        (findings / "driver-sonames.json").write_text(json.dumps(ours, indent=2, sort_keys=True))


# --- the fd probe against a real CUDA context ------------------------------------------------

CUDA_HOLDER = textwrap.dedent(
    """
    import ctypes, sys
    cuda = ctypes.CDLL("libcuda.so.1")
    assert cuda.cuInit(0) == 0, "cuInit"
    dev = ctypes.c_int()
    assert cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0, "cuDeviceGet"
    ctx = ctypes.c_void_p()
    create = getattr(cuda, "cuCtxCreate_v2", None) or cuda.cuCtxCreate
    assert create(ctypes.byref(ctx), 0, dev) == 0, "cuCtxCreate"
    print("ready", flush=True)
    sys.stdin.readline()
    cuda.cuCtxDestroy_v2(ctx)
    """
)


def test_fd_probe_sees_a_real_cuda_context(findings):
    """A process holding a CUDA context is seen by the probe; after it exits, nothing is."""
    holder = subprocess.Popen(
        [sys.executable, "-c", CUDA_HOLDER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        clients = FdScanProbe().scan((holder.pid,))
        targets = {c.target for c in clients}
        keep(findings, "fd-probe-cuda-context", sorted(targets))
        assert "/dev/nvidiactl" in targets
        assert targets & set(gpu_nodes())
    finally:
        if holder.stdin is not None:
            holder.stdin.close()
        holder.wait(timeout=60)
    assert FdScanProbe().scan((holder.pid,)) == ()
