"""Injecting into a bundle on disk: idempotency, crash safety, atomicity, file mode."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import stat
import sys
import threading
from pathlib import Path

import pytest
from support.gpu_nodes import injection_options

from substrate_gpu import exceptions
from substrate_gpu.cdi import model
from substrate_gpu.injection import bundle as bundle_
from substrate_gpu.injection import oci
from substrate_gpu.injection.devices import ResolvedDevice
from substrate_gpu.rootfs import SonameCache
from substrate_gpu.testing import bundles


@pytest.fixture
def options(gpu_node) -> bundle_.InjectionOptions:
    return injection_options(gpu_node)


@pytest.fixture
def actor_bundle(tmp_path) -> Path:
    return bundles.make_bundle(tmp_path / "bundle", ["true"], env=["PATH=/bin"])


def inject(bundle: Path, edits: model.ContainerEdits, options) -> bundle_.InjectionReport:
    return bundle_.inject_gpu(bundle, edits, options=options, soname_cache=SonameCache())


def test_second_injection_leaves_config_byte_identical(actor_bundle, node_edits, options):
    """A second injection changes not a byte of config.json (and says so)."""
    inject(actor_bundle, node_edits, options)
    first = (actor_bundle / "config.json").read_bytes()
    report = inject(actor_bundle, node_edits, options)
    assert report.outcome == "already-injected"
    assert (actor_bundle / "config.json").read_bytes() == first


def test_failure_midway_leaves_config_untouched(actor_bundle, gpu_node, node_edits, options):
    """With the third device node missing on the host, config.json is not touched at all."""
    before = (actor_bundle / "config.json").read_bytes()
    nodes = list(node_edits.device_nodes)
    nodes.insert(2, model.DeviceNode("/dev/nvidia7"))  # unset numbers: must be stat-ed; absent
    broken = model.ContainerEdits(device_nodes=tuple(nodes), mounts=node_edits.mounts)
    with pytest.raises(exceptions.DeviceResolutionError, match="/dev/nvidia7"):
        inject(actor_bundle, broken, options)
    assert (actor_bundle / "config.json").read_bytes() == before
    assert sorted(p.name for p in actor_bundle.iterdir()) == ["config.json", "rootfs"]


def test_file_mode_is_kept(actor_bundle, node_edits, options):
    """The atomic rewrite keeps config.json's original permission bits."""
    (actor_bundle / "config.json").chmod(0o600)
    inject(actor_bundle, node_edits, options)
    assert stat.S_IMODE((actor_bundle / "config.json").stat().st_mode) == 0o600


def test_write_failure_leaves_old_config_and_no_temp_file(
    actor_bundle, node_edits, options, monkeypatch
):
    """If the rename fails, the old config.json stays and no temp file is left behind."""
    before = (actor_bundle / "config.json").read_bytes()

    def failing_replace(source, target, **dir_fds):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(exceptions.InjectionError, match="previous config.json is intact"):
        inject(actor_bundle, node_edits, options)
    monkeypatch.undo()
    assert (actor_bundle / "config.json").read_bytes() == before
    assert sorted(p.name for p in actor_bundle.iterdir()) == ["config.json", "rootfs"]


def test_pause_container_is_never_injected(tmp_path, node_edits, options):
    """The pod sandbox container keeps its config untouched."""
    bundle = bundles.make_bundle(
        tmp_path / "pause", ["pause"], annotations={"io.kubernetes.cri.container-type": "sandbox"}
    )
    before = (bundle / "config.json").read_bytes()
    assert inject(bundle, node_edits, options).outcome == "sandbox-container"
    assert (bundle / "config.json").read_bytes() == before


def test_soname_links_are_staged_in_the_rootfs(actor_bundle, gpu_node, node_edits, options):
    """Each versioned driver library gets its SONAME link beside the mount destination."""
    report = inject(actor_bundle, node_edits, options)
    assert report.links is not None
    libdir = actor_bundle / "rootfs" / str(gpu_node.lib64).lstrip("/")
    assert os.readlink(libdir / "libcuda.so.1") == "libcuda.so.580.65.06"
    assert os.readlink(libdir / "libnvidia-nvvm.so.4") == "libnvidia-nvvm.so.580.65.06"
    # A library that is its own SONAME gets no link.
    assert not (libdir / "libnvidia-tls.so.580.65.06").is_symlink()


def _set_root_path(bundle: Path, root_path: str) -> bytes:
    config = json.loads((bundle / "config.json").read_text())
    config["root"]["path"] = root_path
    (bundle / "config.json").write_text(json.dumps(config))
    return (bundle / "config.json").read_bytes()


@pytest.mark.parametrize(
    ("root_path", "problem"),
    [
        # The rootfs itself is a symlink to a directory outside the bundle.
        pytest.param("rootfs", "'rootfs' on its path is a symbolic link", id="rootfs-link"),
        # A directory on the way to it is one.
        pytest.param("via/rootfs", "'via' on its path is a symbolic link", id="parent-link"),
        # A relative path climbing out of the bundle.
        pytest.param("../outside", "leaves the bundle", id="dot-dot"),
    ],
)
def test_a_rootfs_reached_through_a_symlink_is_refused(
    tmp_path, node_edits, options, root_path, problem
):
    """root.path through a symlink (or out of the bundle): refused; nothing written anywhere."""
    bundle = bundles.make_bundle(tmp_path / "bundle", ["true"])
    outside = tmp_path / "outside"
    (outside / "rootfs").mkdir(parents=True)
    shutil.rmtree(bundle / "rootfs")
    (bundle / "rootfs").symlink_to(outside)
    (bundle / "via").symlink_to(outside)
    before = _set_root_path(bundle, root_path)
    with pytest.raises(exceptions.InjectionError, match=problem):
        inject(bundle, node_edits, options)
    assert [p.name for p in outside.rglob("*")] == ["rootfs"]  # no SONAME link out there
    assert (bundle / "config.json").read_bytes() == before


def test_an_absolute_real_rootfs_is_used(tmp_path, gpu_node, node_edits, options):
    """An absolute root.path (podman writes one) of real directories gets the links."""
    bundle = bundles.make_bundle(tmp_path / "bundle", ["true"])
    _set_root_path(bundle, str(bundle / "rootfs"))
    assert inject(bundle, node_edits, options).outcome == "injected"
    libdir = bundle / "rootfs" / str(gpu_node.lib64).lstrip("/")
    assert os.readlink(libdir / "libcuda.so.1") == "libcuda.so.580.65.06"


def test_edits_without_device_nodes_are_refused(actor_bundle, options):
    """Edits that resolve no device node are an error, not a silent no-op."""
    with pytest.raises(exceptions.InjectionError, match="no device node"):
        inject(actor_bundle, model.ContainerEdits(env=("A=1",)), options)


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        pytest.param(b"{not json", "not valid JSON", id="torn"),
        pytest.param(b"[]", "not a JSON object", id="array"),
        # Strict JSON, as runc (Go) reads it: Python's json alone would take each of these.
        pytest.param(b'{"a": NaN}', "not valid JSON: NaN is not JSON", id="nan"),
        pytest.param(b'{"a": -Infinity}', "not valid JSON: -Infinity is not JSON", id="inf"),
        pytest.param(b'{"a": 1e400}', "not valid JSON: the number 1e400 is out", id="huge"),
        pytest.param(b'{"a": "\\ud800"}', "not valid JSON: .*surrogate", id="lone-surrogate"),
        pytest.param(b'{"a": "\xff"}', "not valid JSON: .*utf-8", id="not-utf-8"),
        pytest.param('{"a": 1}'.encode("utf-16"), "not valid JSON", id="utf-16"),
        pytest.param(b'\xef\xbb\xbf{"a": 1}', "not valid JSON: .*BOM", id="bom"),
    ],
)
def test_unreadable_config_is_a_clear_error(tmp_path, node_edits, options, content, problem):
    """A broken config.json is refused with the file named, and left as it was."""
    (tmp_path / "config.json").write_bytes(content)
    with pytest.raises(exceptions.InjectionError, match=problem):
        inject(tmp_path, node_edits, options)
    assert (tmp_path / "config.json").read_bytes() == content


def test_config_is_written_as_compact_utf8(actor_bundle, node_edits, options):
    """config.json is rewritten compact, non-ASCII as UTF-8 (not \\u escapes), as runc and
    containerd write it."""
    config = json.loads((actor_bundle / "config.json").read_text())
    config["annotations"] = {"note": "café \u2028 ✓"}
    (actor_bundle / "config.json").write_text(json.dumps(config))
    inject(actor_bundle, node_edits, options)
    written = (actor_bundle / "config.json").read_bytes()
    assert "café \u2028 ✓".encode() in written
    assert b": " not in written and b", " not in written
    assert json.loads(written)["annotations"] == {"note": "café \u2028 ✓"}


def test_deeply_nested_config_is_a_clear_error(tmp_path, node_edits, options):
    """100,000 nested [ (json's RecursionError) is an InjectionError naming the file."""
    (tmp_path / "config.json").write_bytes(b"[" * 100_000)
    with pytest.raises(exceptions.InjectionError, match=r"config.json .*nested too deeply"):
        inject(tmp_path, node_edits, options)


def _inject_in_a_thread(bundle: Path, edits, options) -> BaseException | None:
    """Run inject; fail the test (instead of hanging it) when it does not return in 10 s."""
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            inject(bundle, edits, options)
            outcome.append(None)
        except BaseException as e:  # handed to the test
            outcome.append(e)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(10)
    assert outcome, "inject_gpu did not return within 10 s"
    return outcome[0]


def test_fifo_config_is_refused_without_blocking(tmp_path, node_edits, options):
    """A FIFO in place of config.json (nobody writing): refused at once, naming it."""
    os.mkfifo(tmp_path / "config.json")
    error = _inject_in_a_thread(tmp_path, node_edits, options)
    assert isinstance(error, exceptions.InjectionError)
    assert f"refusing {tmp_path}/config.json: it is not a regular file (a FIFO)" in str(error)


def test_symlinked_config_is_refused_and_its_target_untouched(
    tmp_path, actor_bundle, node_edits, options
):
    """config.json as a symlink (to a host file, say) is neither read nor rewritten."""
    host_file = tmp_path / "host-config.json"
    (actor_bundle / "config.json").rename(host_file)
    before = host_file.read_bytes()
    (actor_bundle / "config.json").symlink_to(host_file)
    with pytest.raises(exceptions.InjectionError, match="it is a symbolic link"):
        inject(actor_bundle, node_edits, options)
    assert host_file.read_bytes() == before
    assert (actor_bundle / "config.json").is_symlink()


def test_a_sandbox_app_injected_by_name_lands_in_its_own_directory(tmp_path, node_edits, options):
    """``container=``: the app's bundle under the sandbox's directory is the one injected."""
    app = bundles.make_bundle(tmp_path / "sandbox" / "app", ["true"])
    report = bundle_.inject_gpu(
        tmp_path / "sandbox",
        node_edits,
        options=options,
        soname_cache=SonameCache(),
        container="app",
    )
    assert (report.outcome, report.bundle) == ("injected", app)
    assert json.loads((app / "config.json").read_text())["linux"]["devices"]


def test_a_symlinked_app_directory_is_refused_and_its_target_untouched(
    tmp_path, node_edits, options
):
    """A sandbox's app directory that is a link (to a bundle elsewhere) is never injected."""
    elsewhere = bundles.make_bundle(tmp_path / "elsewhere", ["true"])
    before = (elsewhere / "config.json").read_bytes()
    (tmp_path / "sandbox").mkdir()
    (tmp_path / "sandbox" / "app").symlink_to(elsewhere)
    with pytest.raises(exceptions.InjectionError, match="'app' on its path is a symbolic link"):
        bundle_.inject_gpu(
            tmp_path / "sandbox",
            node_edits,
            options=options,
            soname_cache=SonameCache(),
            container="app",
        )
    assert (elsewhere / "config.json").read_bytes() == before


def test_oversized_config_is_refused(tmp_path, node_edits, options):
    """A config.json over MAX_CONFIG_BYTES is refused before it is read."""
    with (tmp_path / "config.json").open("wb") as f:
        f.truncate(bundle_.MAX_CONFIG_BYTES + 1)  # sparse: no disk written
    with pytest.raises(exceptions.InjectionError, match=r"bytes, over 16777216"):
        inject(tmp_path, node_edits, options)


def test_missing_config_is_a_clear_error(tmp_path, node_edits, options):
    """A bundle without config.json is refused with the path."""
    with pytest.raises(exceptions.InjectionError, match="config.json"):
        inject(tmp_path, node_edits, options)


def test_older_toolkit_spec_resolves_numbers_from_the_host(
    require_root, gpu_node, tmp_path, actor_bundle, options
):
    """A toolkit ≤ 1.18 spec (no numbers) gets the host's numbers, not 0:0."""
    from support.gpu_nodes import generate_spec

    from substrate_gpu import cdi

    spec = generate_spec(gpu_node, tmp_path / "cdi", toolkit_version="1.17.8")
    edits = cdi.edits_for_all(spec)
    assert all(n.major is None for n in edits.device_nodes)
    inject(actor_bundle, edits, options)
    config = json.loads((actor_bundle / "config.json").read_text())
    numbers = {d["path"]: (d["major"], d["minor"]) for d in config["linux"]["devices"]}
    assert numbers["/dev/nvidia0"] == (195, 0)
    assert numbers["/dev/nvidiactl"] == (195, 255)


def left_to_the_host(edits: model.ContainerEdits) -> model.ContainerEdits:
    """``edits`` with numbers and modes left to the host (as nvidia-ctk often does)."""
    return dataclasses.replace(
        edits, device_nodes=tuple(model.DeviceNode(n.path) for n in edits.device_nodes)
    )


def test_a_reused_plan_follows_a_host_node_whose_numbers_changed(
    tmp_path, gpu_node, node_edits, options, require_root
):
    """The resolution is reused across actors only while the host nodes are unchanged."""
    plans = bundle_.PlanCache()
    cache = SonameCache()
    unnumbered = left_to_the_host(node_edits)

    def gpu0_numbers(name: str) -> tuple[int, int]:
        bundle = bundles.make_bundle(tmp_path / name, ["true"])
        bundle_.inject_gpu(
            bundle, unnumbered, options=options, soname_cache=cache, plan_cache=plans
        )
        linux = json.loads((bundle / "config.json").read_text())["linux"]
        (entry,) = [d for d in linux["devices"] if d["path"] == "/dev/nvidia0"]
        return entry["major"], entry["minor"]

    first = gpu0_numbers("first")
    host_node = gpu_node.root / "dev/nvidia0"
    original = host_node.stat().st_rdev
    host_node.unlink()
    os.mknod(host_node, 0o666 | stat.S_IFCHR, os.makedev(first[0], first[1] + 7))
    try:
        assert gpu0_numbers("second") == (first[0], first[1] + 7)
    finally:
        host_node.unlink()
        os.mknod(host_node, 0o666 | stat.S_IFCHR, original)


def test_a_reused_plan_follows_a_chmod_of_a_host_node(
    tmp_path, gpu_node, node_edits, options, require_root
):
    """A node's mode comes from the host: a chmod after the plan was cached is seen."""
    plans, cache = bundle_.PlanCache(), SonameCache()
    edits = left_to_the_host(node_edits)

    def gpu0_mode(name: str) -> int:
        bundle = bundles.make_bundle(tmp_path / name, ["true"])
        bundle_.inject_gpu(bundle, edits, options=options, soname_cache=cache, plan_cache=plans)
        linux = json.loads((bundle / "config.json").read_text())["linux"]
        (entry,) = [d for d in linux["devices"] if d["path"] == "/dev/nvidia0"]
        return entry["fileMode"]

    host_node = gpu_node.root / "dev/nvidia0"
    original = stat.S_IMODE(host_node.stat().st_mode)
    assert gpu0_mode("first") == gpu0_mode("second") == original
    host_node.chmod(0o640)
    try:
        assert gpu0_mode("third") == 0o640
    finally:
        host_node.chmod(original)


def test_a_known_resolution_costs_one_stat_a_node(
    gpu_node, node_edits, options, require_root, monkeypatch
):
    """A later actor's unchanged nodes are stat-ed once each, not resolved again."""
    plans = bundle_.PlanCache()
    edits = left_to_the_host(node_edits)
    first = plans.resolve(edits, options.dev_root)
    calls = []
    real_stat = os.stat
    monkeypatch.setattr(os, "stat", lambda *a, **k: calls.append(a) or real_stat(*a, **k))
    assert plans.resolve(edits, options.dev_root) is first
    assert len(calls) == len(edits.device_nodes)


def test_a_plan_is_never_handed_out_for_other_edits(monkeypatch):
    """Another thread asking for another device set in the middle of planning (simulated at
    every line of ``PlanCache.plan`` once the new plan exists) gets its own plan, and so does
    the first caller: the cache is replaced as one object."""
    gpu1 = model.ContainerEdits(device_nodes=(model.DeviceNode("/dev/nvidia1"),))
    gpu2 = model.ContainerEdits(device_nodes=(model.DeviceNode("/dev/nvidia2"),))
    one = (ResolvedDevice("/dev/nvidia1", "/dev/nvidia1", "c", 195, 1, "rwm", 0o666),)
    two = (ResolvedDevice("/dev/nvidia2", "/dev/nvidia2", "c", 195, 2, "rwm", 0o666),)
    plans = bundle_.PlanCache()

    def plan_for(edits, resolved):
        return plans.plan(edits, resolved, driver_root="/usr", hook_binary="/hook").devices

    assert plan_for(gpu2, two) == two
    planned, inside, others = [], [], []
    real = oci.plan_injection
    monkeypatch.setattr(oci, "plan_injection", lambda *a, **k: planned.append(1) or real(*a, **k))

    def in_plan(frame, event, arg):
        if event == "line" and planned and not inside:
            inside.append(1)
            others.append(plan_for(gpu2, two))
            inside.clear()
        return in_plan

    def tracer(frame, event, arg):
        return in_plan if frame.f_code is bundle_.PlanCache.plan.__code__ else None

    sys.settrace(tracer)
    try:
        mine = plan_for(gpu1, one)
    finally:
        sys.settrace(None)
    assert mine == one
    assert others
    assert all(devices == two for devices in others)


def _gpu_edits(index: int) -> tuple[model.ContainerEdits, tuple[ResolvedDevice, ...]]:
    node = f"/dev/nvidia{index}"
    edits = model.ContainerEdits(
        device_nodes=(model.DeviceNode(node),),
        mounts=(model.Mount("/lib64/libcuda.so.1.2", "/usr/lib64/libcuda.so.1.2", None, ()),),
    )
    return edits, (ResolvedDevice(node, node, "c", 195, index, "rwm", 0o666),)


def test_the_last_device_set_keeps_its_plan(monkeypatch):
    """Later actors with the same device set reuse its plan; another set is planned anew."""
    plans = bundle_.PlanCache()
    calls = []
    real = oci.plan_injection
    monkeypatch.setattr(oci, "plan_injection", lambda *a, **k: calls.append(1) or real(*a, **k))
    one, two = _gpu_edits(1), _gpu_edits(2)
    first = plans.plan(*one, driver_root="/usr", hook_binary="/hook")
    assert plans.plan(*one, driver_root="/usr", hook_binary="/hook") is first
    other = plans.plan(*two, driver_root="/usr", hook_binary="/hook")
    assert other.devices == two[1]
    assert plans.plan(*one, driver_root="/usr", hook_binary="/hook").devices == one[1]
    assert len(calls) == 3
