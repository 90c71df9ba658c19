"""Applying CDI edits to an OCI config the way the CDI reference library does.

Ported from cncf-tags/container-device-interface pkg/cdi/container-edits_test.go
(``TestApplyContainerEdits``), in our terms: the edits go through device resolution, the
plan and :func:`~substrate_gpu.injection.oci.apply_plan`. Where podman's copy of the
reference can show the behaviour, tests/injection/test_podman_oracle.py compares with it too.
The intended differences (hook allowlist, NVIDIA_VISIBLE_DEVICES, LD_LIBRARY_PATH; intelRdt
and netDevices are parsed, not applied) are tested elsewhere.
"""

from __future__ import annotations

import os
import posixpath
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from substrate_gpu import cdi, exceptions
from substrate_gpu.cdi import model
from substrate_gpu.injection import bundle as bundle_
from substrate_gpu.injection import devices, oci
from substrate_gpu.rootfs import SonameCache
from substrate_gpu.testing import bundles

NULL = model.DeviceNode("/dev/null")


@pytest.fixture
def host(tmp_path: Path) -> Path:
    """A host tree: dev/null is /dev/null (c 1:3, mode 0666), dev/fifo a FIFO."""
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev/null").symlink_to("/dev/null")
    os.mkfifo(tmp_path / "dev/fifo", 0o600)
    return tmp_path


def apply(host: Path, edits: model.ContainerEdits, config: dict | None = None) -> dict:
    resolved = devices.resolve_device_numbers(edits.device_nodes, dev_root=host)
    plan = oci.plan_injection(edits, resolved, driver_root="/usr/local/nvidia", hook_binary="/h")
    return oci.apply_plan(config if config is not None else {}, plan)


def user(uid: int, gid: int, *, extra: list[int] | None = None) -> dict:
    process: dict = {"user": {"uid": uid, "gid": gid}}
    if extra is not None:
        process["user"]["additionalGids"] = extra
    return {"process": process}


def rules(config: dict) -> list[dict]:
    return config["linux"]["resources"]["devices"]


# --- device nodes -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("node", "config", "expected_device", "expected_rules"),
    [
        pytest.param(
            NULL,
            {},
            {"path": "/dev/null", "type": "c", "major": 1, "minor": 3, "fileMode": 0o666},
            [{"allow": True, "type": "c", "major": 1, "minor": 3, "access": "rwm"}],
            id="empty-spec-device-from-host",
        ),
        pytest.param(
            model.DeviceNode("/dev/null", permissions="r"),
            {},
            {"path": "/dev/null", "type": "c", "major": 1, "minor": 3, "fileMode": 0o666},
            [{"allow": True, "type": "c", "major": 1, "minor": 3, "access": "r"}],
            id="permissions-become-the-rule-access",
        ),
        pytest.param(
            model.DeviceNode("/dev/nil", type="c", major=1, minor=3, permissions="none"),
            {},
            {"path": "/dev/nil", "type": "c", "major": 1, "minor": 3},
            # The reference's rule with empty access, which runc refuses: no rule instead.
            [],
            id="v1.1.2-explicitly-empty-permissions-grant-no-access",
        ),
        pytest.param(
            model.DeviceNode("/dev/nil", type="c", major=1, minor=3, permissions=None),
            {},
            {"path": "/dev/nil", "type": "c", "major": 1, "minor": 3},
            [{"allow": True, "type": "c", "major": 1, "minor": 3, "access": "rwm"}],
            id="v1.1.2-omitted-permissions-are-rwm",
        ),
        pytest.param(
            NULL,
            user(1000, 1000),
            {
                "path": "/dev/null",
                "type": "c",
                "major": 1,
                "minor": 3,
                "fileMode": 0o666,
                "uid": 1000,
                "gid": 1000,
            },
            [{"allow": True, "type": "c", "major": 1, "minor": 3, "access": "rwm"}],
            id="owner-from-process-user",
        ),
        pytest.param(
            model.DeviceNode("/dev/null", uid=1, gid=2),
            user(1000, 1000),
            {
                "path": "/dev/null",
                "type": "c",
                "major": 1,
                "minor": 3,
                "fileMode": 0o666,
                "uid": 1,
                "gid": 2,
            },
            [{"allow": True, "type": "c", "major": 1, "minor": 3, "access": "rwm"}],
            id="spec-owner-wins-over-process-user",
        ),
        pytest.param(
            NULL,
            user(0, 0),
            {"path": "/dev/null", "type": "c", "major": 1, "minor": 3, "fileMode": 0o666},
            [{"allow": True, "type": "c", "major": 1, "minor": 3, "access": "rwm"}],
            id="root-process-sets-no-owner",
        ),
        pytest.param(
            NULL,
            user(0, 44),
            {
                "path": "/dev/null",
                "type": "c",
                "major": 1,
                "minor": 3,
                "fileMode": 0o666,
                "gid": 44,
            },
            [{"allow": True, "type": "c", "major": 1, "minor": 3, "access": "rwm"}],
            id="only-non-zero-ids-are-copied",
        ),
        pytest.param(
            model.DeviceNode("/dev/fifo"),
            {},
            {"path": "/dev/fifo", "type": "p", "major": 0, "minor": 0, "fileMode": 0o600},
            [],
            id="fifo-gets-no-cgroup-rule",
        ),
        pytest.param(
            model.DeviceNode("/dev/fifo", type="p"),
            {},
            {"path": "/dev/fifo", "type": "p", "major": 0, "minor": 0, "fileMode": 0o600},
            [],
            id="typed-fifo-takes-the-host-mode-and-gets-no-rule",
        ),
        pytest.param(
            model.DeviceNode("/dev/null", type="c", major=195, minor=7),
            {},
            {"path": "/dev/null", "type": "c", "major": 195, "minor": 7, "fileMode": 0o666},
            [{"allow": True, "type": "c", "major": 195, "minor": 7, "access": "rwm"}],
            id="complete-node-keeps-its-numbers-and-takes-the-host-mode",
        ),
        pytest.param(
            model.DeviceNode("/dev/sda", type="b", major=8),
            {},
            {"path": "/dev/sda", "type": "b", "major": 8, "minor": 0},
            [{"allow": True, "type": "b", "major": 8, "minor": 0, "access": "rwm"}],
            id="block-device-gets-a-b-rule",
        ),
        pytest.param(
            model.DeviceNode("/dev/null", major=195, minor=7),
            {},
            {"path": "/dev/null", "type": "c", "major": 195, "minor": 7, "fileMode": 0o666},
            [{"allow": True, "type": "c", "major": 195, "minor": 7, "access": "rwm"}],
            id="file-mode-from-host-even-with-numbers",
        ),
        pytest.param(
            model.DeviceNode("/dev/null", major=195, file_mode=0o600),
            {},
            {"path": "/dev/null", "type": "c", "major": 195, "minor": 0, "fileMode": 0o600},
            [{"allow": True, "type": "c", "major": 195, "minor": 0, "access": "rwm"}],
            id="spec-file-mode-wins",
        ),
    ],
)
def test_device_node(host, node, config, expected_device, expected_rules):
    """One device node: its OCI entry and its cgroup rules."""
    result = apply(host, model.ContainerEdits(device_nodes=(node,)), config)
    assert result["linux"]["devices"] == [expected_device]
    assert rules(result) == expected_rules


def test_device_replaces_an_entry_at_the_same_path(host):
    """A device the config already lists at the same path is replaced, not doubled."""
    config = {"linux": {"devices": [{"path": "/dev/null", "type": "c", "major": 9, "minor": 9}]}}
    result = apply(host, model.ContainerEdits(device_nodes=(NULL,)), config)
    assert [(d["path"], d["major"]) for d in result["linux"]["devices"]] == [("/dev/null", 1)]


# --- mounts --------------------------------------------------------------------------------


def mount(destination: str, source: str = "/src") -> model.Mount:
    return model.Mount(host_path=source, container_path=destination, options=("ro", "bind"))


def destinations(config: dict) -> list[str]:
    return [m["destination"] for m in config["mounts"]]


@pytest.mark.parametrize(
    ("existing", "added", "expected"),
    [
        pytest.param(
            [], ["/a/b/c", "/b", "/a/b", "/a"], ["/b", "/a", "/a/b", "/a/b/c"], id="depth-only"
        ),
        # The reference's TestApplyContainerEdits cases (container-edits_test.go, v1.0.0 on).
        pytest.param(
            ["/dest/path/b", "/dest/path/a"],
            ["/dest/edit"],
            ["/dest/edit", "/dest/path/b", "/dest/path/a"],
            id="reference-edits-do-not-reorder-original-mounts",
        ),
        pytest.param(
            ["/dest/path/c", "/dest/path/b"],
            ["/dest/path/a"],
            ["/dest/path/c", "/dest/path/b", "/dest/path/a"],
            id="reference-added-mount-after-existing-ones-of-the-same-depth",
        ),
        # A runtime's baseline stays in its order: /proc before /dev (issue 22, item 13).
        pytest.param(
            ["/proc", "/dev", "/sys", "/dev/pts", "/dev/shm", "/dev/mqueue", "/sys/fs/cgroup"],
            ["/usr/lib64/libcuda.so.1", "/usr/bin/nvidia-smi", "/run/nvidia-persistenced/socket"],
            [
                "/proc",
                "/dev",
                "/sys",
                "/dev/pts",
                "/dev/shm",
                "/dev/mqueue",
                "/sys/fs/cgroup",
                "/usr/lib64/libcuda.so.1",
                "/usr/bin/nvidia-smi",
                "/run/nvidia-persistenced/socket",
            ],
            id="runtime-baseline-keeps-its-order",
        ),
        pytest.param(["/a/"], ["/b"], ["/a/", "/b"], id="trailing-slash-cleaned-for-depth"),
    ],
)
def test_mounts_are_ordered_like_the_reference(host, existing, added, expected):
    """All mounts end up stably sorted by destination depth only: same depth, same order."""
    config = {"mounts": [{"destination": d, "type": "bind", "source": "/x"} for d in existing]}
    edits = model.ContainerEdits(device_nodes=(NULL,), mounts=tuple(mount(d) for d in added))
    assert destinations(apply(host, edits, config)) == expected


def test_spec_mount_replaces_a_mount_at_the_same_destination(host):
    """The config's /dev/shm is replaced by the spec's mount there (the reference removes it)."""
    config = {"mounts": [{"destination": "/dev/shm", "type": "tmpfs", "source": "shm"}]}
    edits = model.ContainerEdits(device_nodes=(NULL,), mounts=(mount("/dev/shm", "/host/shm"),))
    result = apply(host, edits, config)
    assert result["mounts"] == [
        {
            "destination": "/dev/shm",
            "type": "bind",
            "source": "/host/shm",
            "options": ["ro", "bind"],
        }
    ]


# --- mounts in a user namespace (id-mapped) -------------------------------------------------

UID_MAP = [{"containerID": 0, "hostID": 1000, "size": 999}]
GID_MAP = [{"containerID": 0, "hostID": 2000, "size": 777}]
USERNS = [{"type": "user", "path": "/foo/bar"}]


@pytest.mark.parametrize(
    ("linux", "expected_options"),
    [
        pytest.param(
            {"uidMappings": UID_MAP, "gidMappings": GID_MAP, "namespaces": USERNS},
            [["idmap"], ["rbind", "ridmap"]],
            id="uid-gid-mappings-idmap-and-ridmap",
        ),
        # v1.1.2: runc refuses an id-mapped mount unless both mappings are present.
        pytest.param(
            {"uidMappings": UID_MAP, "namespaces": USERNS},
            [[], ["rbind"]],
            id="v1.1.2-only-uid-mappings-none",
        ),
        pytest.param({"namespaces": USERNS}, [[], ["rbind"]], id="v1.1.2-no-mappings-none"),
        pytest.param({}, [[], ["rbind"]], id="no-user-namespace-none"),
    ],
)
def test_bind_mounts_are_id_mapped_in_a_full_user_namespace(host, linux, expected_options):
    """TestApplyContainerEdits' user-namespace rows: a bind mount gets idmap, an rbind one
    ridmap, only when the user namespace has both uid and gid mappings."""
    edits = model.ContainerEdits(
        device_nodes=(NULL,),
        mounts=(
            model.Mount("/some/host/path3", "/dest/path/a", type="bind"),
            model.Mount("/some/host/path4", "/dest/path/d", type="bind", options=("rbind",)),
        ),
    )
    result = apply(host, edits, {"linux": dict(linux)})
    assert [m["options"] for m in result["mounts"]] == expected_options


@pytest.mark.parametrize(
    ("mount_", "expected"),
    [
        pytest.param(
            model.Mount("/h", "/c", options=("ro",)), ["ro"], id="untyped-without-bind-option"
        ),
        pytest.param(
            model.Mount("/h", "/c", options=("ro", "rbind", "rprivate")),
            ["ro", "rbind", "rprivate", "ridmap"],
            id="nvidia-ctk-rbind",
        ),
        pytest.param(
            model.Mount("/h", "/c", type="bind", options=("idmap",)), ["idmap"], id="already"
        ),
    ],
)
def test_the_id_map_option_follows_the_mounts_own_options(host, mount_, expected):
    """nvidia-ctk's untyped ``rbind`` mounts get ``ridmap``; one already mapped is left."""
    edits = model.ContainerEdits(device_nodes=(NULL,), mounts=(mount_,))
    config = {"linux": {"uidMappings": UID_MAP, "gidMappings": GID_MAP, "namespaces": USERNS}}
    assert apply(host, edits, config)["mounts"][0]["options"] == expected


# --- additionalGids ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("existing", "gids", "expected"),
    [
        pytest.param(None, (5,), [5], id="added"),
        pytest.param(None, (0,), None, id="gid-zero-skipped"),
        pytest.param(None, (0, 5, 0, 7), [5, 7], id="zero-skipped-among-others"),
        pytest.param([5], (5, 6), [5, 6], id="no-duplicates"),
    ],
)
def test_additional_gids(host, existing, gids, expected):
    """additionalGids are added once each; GID 0 (root's group) never is."""
    edits = model.ContainerEdits(device_nodes=(NULL,), additional_gids=gids)
    result = apply(host, edits, user(1000, 1000, extra=existing))
    assert result["process"]["user"].get("additionalGids") == expected


# --- env -----------------------------------------------------------------------------------


def test_env_is_added(host):
    """The spec's env reaches the process."""
    edits = model.ContainerEdits(device_nodes=(NULL,), env=("BAR=BARVALUE1",))
    assert apply(host, edits, {"process": {"env": ["A=1"]}})["process"]["env"] == [
        "A=1",
        "BAR=BARVALUE1",
    ]


# --- named-device safety -------------------------------------------------------------------


def test_bundle_holding_another_gpu_is_refused(host):
    """A config that already holds /dev/nvidia3 cannot also get a different GPU."""
    (host / "dev/nvidia1").symlink_to("/dev/null")
    config = {
        "linux": {"devices": [{"path": "/dev/nvidia3", "type": "c", "major": 195, "minor": 3}]}
    }
    edits = model.ContainerEdits(device_nodes=(model.DeviceNode("/dev/nvidia1"),))
    with pytest.raises(
        exceptions.InjectionError,
        match=r"already holds /dev/nvidia3, which this injection does not grant",
    ):
        apply(host, edits, config)


_SEGMENTS = st.sampled_from(["a", "b", "dev", "shm", "lib", "x.so.1", ".", ""])
_DESTINATIONS = st.lists(_SEGMENTS, min_size=1, max_size=4).map(lambda parts: "/" + "/".join(parts))


@given(
    existing=st.lists(_DESTINATIONS, max_size=8),
    added=st.lists(_DESTINATIONS, min_size=1, max_size=8, unique=True),
)
@settings(max_examples=200, deadline=None)
def test_mount_merge_equals_the_reference_stable_sort(existing, added):
    """Whatever the destinations: the config's kept mounts then the plan's, stably sorted by
    depth alone (the reference's sort.Stable(orderedMounts))."""
    config = {
        "mounts": [{"destination": d, "source": f"config{i}"} for i, d in enumerate(existing)]
    }
    edits = model.ContainerEdits(mounts=tuple(mount(d, f"/plan{i}") for i, d in enumerate(added)))
    plan = oci.plan_injection(edits, (), driver_root="/usr", hook_binary="/h")
    result = oci.apply_plan(config, plan)

    replaced = {posixpath.normpath(m.container_path) for m in plan.mounts}
    kept = [
        (d, f"config{i}") for i, d in enumerate(existing) if posixpath.normpath(d) not in replaced
    ]
    planned = [(m.container_path, m.host_path) for m in plan.mounts]
    expected = sorted(kept + planned, key=lambda pair: posixpath.normpath(pair[0]).count("/"))
    assert [(m["destination"], m["source"]) for m in result["mounts"]] == expected


# --- the parsed spec is never changed by an injection ---------------------------------------


def test_injecting_does_not_change_the_shared_spec_or_reuse_stale_host_facts(tmp_path):
    """The reference's v1.1.2 TestInjectDevicesDoesNotMutateCache: a node resolved from the
    host (a FIFO) leaves the cached spec's node as written, and once the host file is no
    longer a device node the next injection through the same caches fails, not reusing
    what the first one read."""
    fifo = tmp_path / "dev0"
    os.mkfifo(fifo, 0o600)
    specs = tmp_path / "cdi"
    specs.mkdir()
    (specs / "vendor1.yaml").write_text(
        f'cdiVersion: "0.3.0"\nkind: "vendor1.com/device"\ndevices:\n  - name: "dev0"\n'
        f"    containerEdits:\n      deviceNodes:\n      - path: {fifo}\n"
    )
    reader = cdi.SpecDirReader([specs])
    edits = cdi.edits_for_devices(reader.read(), ["vendor1.com/device=dev0"])
    plans = bundle_.PlanCache()
    options = bundle_.InjectionOptions(driver_root="/usr/local/nvidia", dev_root=Path("/"))
    first = bundles.make_bundle(tmp_path / "b1", ["true"])
    report = bundle_.inject_gpu(
        first, edits, options=options, soname_cache=SonameCache(), plan_cache=plans
    )
    assert [(d.path, d.type) for d in report.devices] == [(str(fifo), "p")]
    assert report.devices[0].file_mode == 0o600
    (cached,) = cdi.edits_for_devices(reader.read(), ["vendor1.com/device=dev0"]).device_nodes
    assert cached == model.DeviceNode(str(fifo))
    fifo.unlink()
    fifo.write_bytes(b"")
    second = bundles.make_bundle(tmp_path / "b2", ["true"])
    with pytest.raises(exceptions.DeviceResolutionError, match="is not a device node"):
        bundle_.inject_gpu(
            second, edits, options=options, soname_cache=SonameCache(), plan_cache=plans
        )
