"""The pure core: CDI edits + resolved devices → a new OCI config."""

from __future__ import annotations

import copy

import pytest

from substrate_gpu import exceptions
from substrate_gpu.cdi import model
from substrate_gpu.injection import oci
from substrate_gpu.injection.devices import ResolvedDevice

LIBDIR = "/usr/local/nvidia/lib64"
HOOK = "/opt/nvidia-toolkit/nvidia-cdi-hook"

NVIDIA0 = ResolvedDevice("/dev/nvidia0", "/dev/nvidia0", "c", 195, 0, "rwm", 0o666)
NVIDIACTL = ResolvedDevice("/dev/nvidiactl", "/dev/nvidiactl", "c", 195, 255, "rwm", 0o666)


def hook(*args: str, point: str = "createContainer", path: str = "/usr/bin/nvidia-cdi-hook"):
    return model.Hook(hook_name=point, path=path, args=args, env=("NVIDIA_CTK_DEBUG=false",))


EDITS = model.ContainerEdits(
    env=("NVIDIA_CTK_LIBCUDA_DIR=" + LIBDIR, "NVIDIA_VISIBLE_DEVICES=void"),
    device_nodes=(model.DeviceNode("/dev/nvidia0"), model.DeviceNode("/dev/nvidiactl")),
    mounts=(
        model.Mount(
            f"{LIBDIR}/libcuda.so.580.65.06",
            f"{LIBDIR}/libcuda.so.580.65.06",
            None,
            ("ro", "nosuid", "nodev", "bind"),
        ),
        model.Mount(
            "/usr/bin/nvidia-smi", "/usr/bin/nvidia-smi", None, ("ro", "nosuid", "nodev", "bind")
        ),
    ),
    hooks=(
        hook("nvidia-cdi-hook", "create-symlinks", "--link", f"libcuda.so.1::{LIBDIR}/libcuda.so"),
        hook("nvidia-cdi-hook", "enable-cuda-compat", "--host-driver-version=580.65.06"),
        hook("nvidia-cdi-hook", "update-ldcache", "--folder", LIBDIR),
        hook("nvidia-cdi-hook", "disable-device-node-modification"),
        hook("nvidia-cdi-hook", "update-application-profile"),
    ),
)


def plan(edits: model.ContainerEdits = EDITS, devices=(NVIDIA0, NVIDIACTL)) -> oci.InjectionPlan:
    return oci.plan_injection(edits, devices, driver_root="/usr/local/nvidia", hook_binary=HOOK)


def base_config(env: list[str] | None = None) -> oci.OciConfig:
    return {
        "ociVersion": "1.0.2",
        "process": {"args": ["sh"], "env": env if env is not None else ["PATH=/bin"]},
        "root": {"path": "rootfs"},
        "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"}],
        "linux": {"resources": {"devices": [{"allow": False, "access": "rwm"}]}},
    }


@pytest.mark.parametrize(
    ("image_env", "expected"),
    [
        # The image's NVIDIA_VISIBLE_DEVICES would make runsc inject a second time.
        pytest.param(
            ["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=all"],
            ["PATH=/bin", f"NVIDIA_CTK_LIBCUDA_DIR={LIBDIR}", f"LD_LIBRARY_PATH={LIBDIR}"],
            id="visible-devices-dropped",
        ),
        # An image that sets LD_LIBRARY_PATH keeps its value after the driver dir.
        pytest.param(
            ["LD_LIBRARY_PATH=/opt/lib:/usr/lib"],
            [f"NVIDIA_CTK_LIBCUDA_DIR={LIBDIR}", f"LD_LIBRARY_PATH={LIBDIR}:/opt/lib:/usr/lib"],
            id="ld-path-prepended",
        ),
        # Two entries in the image: the later one wins in OCI, and only one may remain.
        pytest.param(
            ["LD_LIBRARY_PATH=/a", "X=1", "LD_LIBRARY_PATH=/b"],
            ["X=1", f"NVIDIA_CTK_LIBCUDA_DIR={LIBDIR}", f"LD_LIBRARY_PATH={LIBDIR}:/b"],
            id="ld-path-duplicates-collapsed",
        ),
        # The driver dir already present is moved first, not duplicated.
        pytest.param(
            [f"LD_LIBRARY_PATH=/a:{LIBDIR}"],
            [f"NVIDIA_CTK_LIBCUDA_DIR={LIBDIR}", f"LD_LIBRARY_PATH={LIBDIR}:/a"],
            id="driver-dir-not-duplicated",
        ),
        # A spec env key the image also sets is replaced, not doubled.
        pytest.param(
            ["NVIDIA_CTK_LIBCUDA_DIR=/old"],
            [f"NVIDIA_CTK_LIBCUDA_DIR={LIBDIR}", f"LD_LIBRARY_PATH={LIBDIR}"],
            id="spec-key-replaces-image-key",
        ),
    ],
)
def test_env_rules(image_env, expected):
    """Env after injection follows the brief's rules exactly."""
    assert oci.merge_env(image_env, plan()) == expected


def test_spec_visible_devices_is_dropped_too():
    """The spec's own NVIDIA_VISIBLE_DEVICES=void never reaches the actor."""
    assert "NVIDIA_VISIBLE_DEVICES=void" not in plan().env


def test_devices_get_nodes_and_matching_cgroup_rules():
    """Each device is in linux.devices and has an rwm allow rule with its numbers."""
    config = oci.apply_plan(base_config(), plan())
    assert config["linux"]["devices"] == [
        {"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0, "fileMode": 0o666},
        {"path": "/dev/nvidiactl", "type": "c", "major": 195, "minor": 255, "fileMode": 0o666},
    ]
    assert config["linux"]["resources"]["devices"] == [
        {"allow": False, "access": "rwm"},
        {"allow": True, "type": "c", "major": 195, "minor": 0, "access": "rwm"},
        {"allow": True, "type": "c", "major": 195, "minor": 255, "access": "rwm"},
    ]


def test_mounts_default_to_bind_and_keep_options():
    """Mounts get type bind when the spec gives none, and the options as given."""
    config = oci.apply_plan(base_config(), plan())
    assert config["mounts"][1:] == [
        {
            "destination": "/usr/bin/nvidia-smi",
            "type": "bind",
            "source": "/usr/bin/nvidia-smi",
            "options": ["ro", "nosuid", "nodev", "bind"],
        },
        {
            "destination": f"{LIBDIR}/libcuda.so.580.65.06",
            "type": "bind",
            "source": f"{LIBDIR}/libcuda.so.580.65.06",
            "options": ["ro", "nosuid", "nodev", "bind"],
        },
    ]


def test_mounts_are_ordered_parents_first():
    """A deeper destination is never mounted before a shallower one."""
    config = oci.apply_plan(base_config(), plan())
    depths = [len(m["destination"].strip("/").split("/")) for m in config["mounts"]]
    assert depths == sorted(depths)


@pytest.mark.parametrize(
    ("args", "subcommand", "verdict"),
    [
        pytest.param(
            ("nvidia-cdi-hook", "create-symlinks", "--link", "a::b"),
            "create-symlinks",
            "keep",
            id="cdi-hook-create-symlinks",
        ),
        pytest.param(
            ("nvidia-cdi-hook", "enable-cuda-compat", "--host-driver-version=1"),
            "enable-cuda-compat",
            "keep",
            id="cdi-hook-compat",
        ),
        pytest.param(
            ("nvidia-ctk", "hook", "create-symlinks", "--link", "a::b"),
            "create-symlinks",
            "keep",
            id="ctk-1.15-create-symlinks",
        ),
        pytest.param(
            ("nvidia-ctk", "hook", "update-ldcache", "--folder", "/x"),
            "update-ldcache",
            "skip",
            id="ctk-1.15-update-ldcache",
        ),
        pytest.param(
            ("nvidia-cdi-hook", "update-ldcache", "--folder", "/x"),
            "update-ldcache",
            "skip",
            id="update-ldcache",
        ),
        pytest.param(("nvidia-cdi-hook", "chmod", "--mode", "755"), "chmod", "skip", id="chmod"),
        pytest.param(
            ("nvidia-cdi-hook", "disable-device-node-modification"),
            "disable-device-node-modification",
            "skip",
            id="disable-node-mod",
        ),
        pytest.param(
            ("nvidia-cdi-hook", "update-application-profile"),
            "update-application-profile",
            "skip",
            id="app-profile",
        ),
        # A hook from another vendor is never run, whatever it is called.
        pytest.param(("/usr/bin/other", "create-symlinks"), None, "skip", id="not-a-toolkit-hook"),
    ],
)
def test_hook_allowlist(args, subcommand, verdict):
    """Only create-symlinks and enable-cuda-compat survive, in both argv shapes."""
    from substrate_gpu.injection import hooks

    decision = hooks.classify_hook(hook(*args, path="/usr/bin/" + args[0].rsplit("/", 1)[-1]))
    assert (decision.subcommand, decision.verdict) == (subcommand, verdict)


def test_allowlisted_hook_at_another_point_is_skipped():
    """create-symlinks registered as a prestart hook is not run."""
    from substrate_gpu.injection import hooks

    decision = hooks.classify_hook(hook("nvidia-cdi-hook", "create-symlinks", point="prestart"))
    assert decision.verdict == "skip"


def test_kept_hooks_are_rewritten_to_the_mounted_toolkit():
    """Kept hooks run the mounted toolkit's nvidia-cdi-hook with the same arguments."""
    edits = model.ContainerEdits(
        device_nodes=EDITS.device_nodes,
        hooks=(
            hook(
                "nvidia-ctk",
                "hook",
                "create-symlinks",
                "--link",
                "a::b",
                path="/usr/bin/nvidia-ctk",
            ),
        ),
    )
    config = oci.apply_plan(base_config(), plan(edits))
    assert config["hooks"]["createContainer"] == [
        {
            "path": HOOK,
            "args": ["nvidia-cdi-hook", "create-symlinks", "--link", "a::b"],
            "env": ["NVIDIA_CTK_DEBUG=false"],
        }
    ]


def test_skipped_hooks_are_named():
    """The plan names every skipped hook (the injector logs each)."""
    assert [d.name for d in plan().skipped_hooks] == [
        "update-ldcache",
        "disable-device-node-modification",
        "update-application-profile",
    ]


def test_apply_does_not_mutate_its_input():
    """apply_plan returns a new config; the one passed in is unchanged."""
    config = base_config(["NVIDIA_VISIBLE_DEVICES=all"])
    before = copy.deepcopy(config)
    oci.apply_plan(config, plan())
    assert config == before


def test_second_apply_adds_nothing():
    """Applying the same plan twice doubles no device, rule, mount, env entry or hook."""
    once = oci.apply_plan(base_config(), plan())
    assert oci.apply_plan(once, plan()) == once


def test_already_injected_when_bundle_holds_the_devices():
    """The idempotency guard fires once the bundle holds every planned device node."""
    assert not oci.already_injected(base_config(), plan())
    assert oci.already_injected(oci.apply_plan(base_config(), plan()), plan())


def test_already_injected_refuses_a_bundle_holding_more_gpus():
    """A bundle holding GPUs 0 and 3, planned for GPU 0 alone: refused, not "already done"."""
    nvidia3 = ResolvedDevice("/dev/nvidia3", "/dev/nvidia3", "c", 195, 3, "rwm", 0o666)
    both = model.ContainerEdits(
        device_nodes=(*EDITS.device_nodes, model.DeviceNode("/dev/nvidia3"))
    )
    config = oci.apply_plan(base_config(), plan(both, (NVIDIA0, NVIDIACTL, nvidia3)))
    with pytest.raises(
        exceptions.InjectionError, match=r"x/config.json already holds /dev/nvidia3, which"
    ):
        oci.already_injected(config, plan(), where="x/config.json")


def _gpu(index: int) -> ResolvedDevice:
    path = f"/dev/nvidia{index}"
    return ResolvedDevice(path, path, "c", 195, index, "rwm", 0o666)


@pytest.mark.parametrize(
    ("held", "granted", "foreign"),
    [
        # Every GPU index is a GPU: none may be skipped (1 once was, by a hand mutation).
        *(
            pytest.param((0, index), (0,), [f"/dev/nvidia{index}"], id=f"0+{index}-for-0")
            for index in (1, 2, 3, 9, 10, 11, 15)
        ),
        pytest.param((0,), (1,), ["/dev/nvidia0"], id="0-for-1"),
        pytest.param((1,), (0,), ["/dev/nvidia1"], id="1-for-0"),
        pytest.param(
            (0, 1, 2, 3), (2,), ["/dev/nvidia0", "/dev/nvidia1", "/dev/nvidia3"], id="4-for-2"
        ),
        pytest.param((1, 3), (1, 3), [], id="the-same"),
        pytest.param((1,), (1, 3), [], id="fewer"),
    ],
)
def test_every_gpu_node_not_granted_is_foreign(held, granted, foreign):
    """The GPU nodes a bundle holds that the plan does not grant, whatever their index;
    nvidiactl (shared by every GPU) never counts."""
    devices = [NVIDIACTL, *(_gpu(i) for i in held)]
    edits = model.ContainerEdits(device_nodes=tuple(model.DeviceNode(d.path) for d in devices))
    config = oci.apply_plan(base_config(), plan(edits, tuple(devices)))
    wanted = [NVIDIACTL, *(_gpu(i) for i in granted)]
    edits = model.ContainerEdits(device_nodes=tuple(model.DeviceNode(d.path) for d in wanted))
    assert oci.foreign_gpu_nodes(config, plan(edits, tuple(wanted))) == foreign


def test_additional_gids_are_added_once():
    """additionalGids from the spec reach process.user without duplicates."""
    edits = model.ContainerEdits(device_nodes=EDITS.device_nodes, additional_gids=(39, 44))
    config = base_config()
    config["process"]["user"] = {"uid": 0, "gid": 0, "additionalGids": [44]}
    assert oci.apply_plan(config, plan(edits))["process"]["user"]["additionalGids"] == [44, 39]


@pytest.mark.parametrize(
    ("mounts", "expected"),
    [
        pytest.param(
            (model.Mount("/R/lib64/libcuda.so.1.2", "/usr/lib64/libcuda.so.1.2"),),
            "/usr/lib64",
            id="libcuda-container-dir",
        ),
        pytest.param(
            (
                model.Mount(
                    "/usr/local/nvidia/lib64/libnvidia-ml.so.1.2", "/lib/libnvidia-ml.so.1.2"
                ),
            ),
            "/lib",
            id="any-lib-from-driver-lib64",
        ),
        pytest.param(
            (model.Mount("/usr/bin/nvidia-smi", "/usr/bin/nvidia-smi"),),
            None,
            id="no-driver-library",
        ),
    ],
)
def test_driver_library_dir_is_where_the_spec_mounts_it(mounts, expected):
    """LD_LIBRARY_PATH gets the container directory the driver libraries are mounted in."""
    edits = model.ContainerEdits(mounts=mounts)
    assert oci.driver_library_dir(edits, "/usr/local/nvidia") == expected


@pytest.mark.parametrize(
    ("config", "where"),
    [
        pytest.param({"linux": []}, ".linux", id="linux-not-object"),
        pytest.param({"linux": {"devices": {}}}, ".linux.devices", id="devices-not-list"),
        pytest.param({"process": {"env": "PATH=/bin"}}, ".process.env", id="env-not-list"),
    ],
)
def test_malformed_config_is_a_clear_error(config, where):
    """A config.json of the wrong shape is refused, naming the field."""
    with pytest.raises(exceptions.InjectionError, match=where.replace(".", r"\.")):
        oci.apply_plan(config, plan())


@pytest.mark.parametrize(
    ("annotations", "sandbox"),
    [
        pytest.param({"io.kubernetes.cri.container-type": "sandbox"}, True, id="containerd-pause"),
        pytest.param({"io.kubernetes.cri-o.ContainerType": "sandbox"}, True, id="crio-pause"),
        pytest.param({"io.kubernetes.cri.container-type": "container"}, False, id="app-container"),
        pytest.param({}, False, id="no-annotations"),
    ],
)
def test_pause_container_is_recognised(annotations, sandbox):
    """The pod's pause container is recognised by its CRI annotations."""
    assert oci.is_sandbox_container({"annotations": annotations}) is sandbox
