"""Our injection against the CDI reference implementation (podman's embedded CDI library).

``podman create --device <qualified name>`` + ``podman init`` writes the OCI config the
reference library produces for a spec in /etc/cdi (see tests/support/cdi_oracle.py). For the
same spec, request and host, our device nodes, cgroup rules and mounts must match it.
podman 4.3's library accepts cdiVersion ≤ 0.5.0 here; the toolkit stand-in writes 0.5.0, as
nvidia-ctk does for this content. Hooks and env are *meant* to differ (allowlist;
NVIDIA_VISIBLE_DEVICES dropped; LD_LIBRARY_PATH) and are compared for exactly those
differences. podman 4.3's library predates three rules we follow from the current reference
(``fileMode`` from the host; ``additionalGids``, which needs cdiVersion 0.7.0; the stable,
depth-only mount order): those are covered by tests/injection/test_reference_edits.py only.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import cdi_oracle
from support.real import missing

from substrate_gpu import cdi, exceptions
from substrate_gpu.injection import bundle as bundle_
from substrate_gpu.rootfs import SonameCache
from substrate_gpu.testing import bundles
from substrate_gpu.testing import node as node_

pytestmark = pytest.mark.runc


@pytest.fixture(scope="module")
def podman(require_root, tmp_path_factory) -> Iterator[cdi_oracle.Podman]:
    """podman with private, throw-away storage, and a busybox image imported into it.

    Its run root is a short directory of its own: podman refuses one of more than 50
    characters, which pytest's numbered temp paths under xdist workers can reach
    (``/tmp/pytest-of-root/pytest-56/popen-gw0/podman0/run`` is 51)."""
    binary = cdi_oracle.find_podman()
    if binary is None:
        missing("podman", "is not installed")
    with tempfile.TemporaryDirectory(prefix="podman-", dir="/tmp") as run:
        yield cdi_oracle.Podman.create(
            binary, tmp_path_factory.mktemp("podman"), bundles.find_busybox(), run=Path(run)
        )


def generate(sim: node_.SimulatedNode, out: Path, toolkit_version: str = "1.20.0") -> dict:
    """The stand-in's spec for ``sim`` (host paths under the node root), with a unique kind."""
    subprocess.run(
        [
            str(sim.toolkit_dir / "nvidia-ctk"),
            "cdi",
            "generate",
            "--format=json",
            f"--dev-root={sim.root}",
            f"--library-search-path={sim.lib64}",
            f"--output={out}",
        ],
        env={
            **os.environ,
            "NVIDIA_CTK_STANDIN_VERSION": toolkit_version,
            "PATH": f"{sim.driver_root}/bin:{os.environ['PATH']}",
        },
        check=True,
    )
    spec = json.loads(out.read_text())
    spec["kind"] = cdi_oracle.unique_kind()
    return spec


def ours(
    tmp_path: Path,
    edits: cdi.ContainerEdits,
    *,
    driver_root: str = "/usr/local/nvidia",
    dev_root: Path = Path("/"),
    user: tuple[int, int] = (0, 0),
    mounts: list[dict] | None = None,
) -> dict:
    """The config our injection writes into a fresh bundle."""
    bundle = bundles.make_bundle(
        tmp_path / "bundle", ["sh"], env=["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=all"]
    )
    config = json.loads((bundle / "config.json").read_text())
    config["process"]["user"] = {"uid": user[0], "gid": user[1]}
    if mounts is not None:
        config["mounts"] = mounts
    (bundle / "config.json").write_text(json.dumps(config))
    bundle_.inject_gpu(
        bundle,
        edits,
        options=bundle_.InjectionOptions(driver_root=driver_root, dev_root=dev_root),
        soname_cache=SonameCache(),
    )
    return json.loads((bundle / "config.json").read_text())


def devices(config: dict) -> list[tuple]:
    return sorted(
        (d["path"], d["type"], d["major"], d["minor"], d.get("uid"), d.get("gid"))
        for d in config["linux"]["devices"]
    )


def rules(config: dict) -> list[tuple]:
    return sorted(
        (r["type"], r["major"], r["minor"], r["access"])
        for r in config["linux"]["resources"]["devices"]
        if r.get("allow")
    )


def mounts_from(config: dict, prefix: str) -> list[tuple]:
    return sorted(
        (m["destination"], m["source"], tuple(m.get("options", ())))
        for m in config["mounts"]
        if m["source"].startswith(prefix)
    )


@pytest.mark.parametrize(
    "toolkit_version",
    [
        pytest.param("1.17.8", id="numbers-from-host-stat"),
        pytest.param("1.20.0", id="numbers-in-spec"),
    ],
)
def test_devices_rules_and_mounts_match_the_reference(podman, tmp_path, toolkit_version):
    """Same spec, same host: same device nodes, cgroup allow rules and mounts as the reference."""
    sim = node_.build_node(tmp_path / "node", gpus=(0, 2))
    spec = generate(sim, tmp_path / "spec.json", toolkit_version)
    reference = podman.reference_config({"spec": spec}, [f"{spec['kind']}=all"])
    mine = ours(
        tmp_path,
        cdi.edits_for_all(cdi.parse_spec(json.dumps(spec))),
        driver_root=str(sim.driver_root),
    )

    assert devices(mine) == devices(reference)
    assert rules(mine) == rules(reference)
    assert mounts_from(mine, str(sim.root)) == mounts_from(reference, str(sim.root))
    assert len(devices(mine)) == 5  # nvidia0, nvidia2, nvidiactl, nvidia-uvm, nvidia-uvm-tools

    # The intended differences: the reference keeps NVIDIA_VISIBLE_DEVICES and every hook.
    assert "NVIDIA_VISIBLE_DEVICES=void" in reference["process"]["env"]
    assert not [e for e in mine["process"]["env"] if e.startswith("NVIDIA_VISIBLE_DEVICES=")]
    assert len(reference["hooks"]["createContainer"]) == 5
    assert [h["args"][1] for h in mine["hooks"]["createContainer"]] == [
        "create-symlinks",
        "enable-cuda-compat",
    ]


def test_a_toolkit_1_20_2_spec_matches_the_reference_but_for_the_memory_hook(podman, tmp_path):
    """The 1.20.2 shape: the same nodes, rules and mounts as the reference, the void mount
    included; the reference keeps one createRuntime apply-cuda-memory-limits per GPU, we
    keep none (skipped: docs/gpu-injection.md)."""
    sim = node_.build_node(tmp_path / "node", gpus=(0, 2))
    spec = generate(sim, tmp_path / "spec.json", "1.20.2")
    reference = podman.reference_config({"spec": spec}, [f"{spec['kind']}=all"])
    mine = ours(
        tmp_path,
        cdi.edits_for_all(cdi.parse_spec(json.dumps(spec))),
        driver_root=str(sim.driver_root),
    )
    assert devices(mine) == devices(reference)
    assert rules(mine) == rules(reference)
    assert (
        mounts_from(mine, "/dev/null")
        == mounts_from(reference, "/dev/null")
        == [
            (
                "/var/run/nvidia-container-devices/void",
                "/dev/null",
                ("ro", "nosuid", "nodev", "bind"),
            )
        ]
    )
    runtime_hooks = [h["args"][1:] for h in reference["hooks"]["createRuntime"]]
    assert [h[0] for h in runtime_hooks] == ["apply-cuda-memory-limits"] * 2
    assert "createRuntime" not in mine.get("hooks", {})


@pytest.fixture(scope="module")
def four_gpu_node(tmp_path_factory) -> tuple[node_.SimulatedNode, dict]:
    """A simulated 4-GPU node and the stand-in's spec for it."""
    work = tmp_path_factory.mktemp("four")
    sim = node_.build_node(work / "node", gpus=(0, 1, 2, 3))
    return sim, generate(sim, work / "spec.json")


@pytest.mark.parametrize(
    "names",
    [
        pytest.param(["2"], id="gpu-2"),
        pytest.param(["3", "1"], id="gpus-3-and-1"),
        pytest.param(["uuid-of-0"], id="by-uuid"),
    ],
)
def test_named_gpus_match_the_reference(podman, four_gpu_node, tmp_path, names):
    """Named GPUs on a 4-GPU node: the same nodes, rules and mounts as the reference."""
    sim, spec = four_gpu_node
    if names == ["uuid-of-0"]:
        names = [next(d["name"] for d in spec["devices"] if d["name"].startswith("GPU-"))]
    requested = [f"{spec['kind']}={n}" for n in names]
    reference = podman.reference_config({"spec": spec}, requested)
    edits = cdi.edits_for_devices(cdi.SpecSet([cdi.parse_spec(json.dumps(spec))]), requested)
    mine = ours(tmp_path, edits, driver_root=str(sim.driver_root))
    assert devices(mine) == devices(reference)
    assert rules(mine) == rules(reference)
    assert mounts_from(mine, str(sim.root)) == mounts_from(reference, str(sim.root))
    gpu_nodes = sorted(d[0] for d in devices(mine) if d[0][len("/dev/nvidia") :].isdigit())
    assert len(gpu_nodes) == len(names)


def test_unknown_and_conflicting_names_are_refused_like_the_reference(podman, tmp_path):
    """An unknown name and a name two specs define: the reference and we both refuse."""
    kind = cdi_oracle.unique_kind()

    def spec(path: str) -> dict:
        node = {"deviceNodes": [{"path": path}]}
        return {
            "cdiVersion": "0.5.0",
            "kind": kind,
            "devices": [{"name": "d", "containerEdits": node}],
        }

    for specs, name in (
        ({"a": spec("/dev/null")}, "zz"),
        ({"a": spec("/dev/null"), "b": spec("/dev/zero")}, "d"),
    ):
        with pytest.raises(cdi_oracle.OracleRefused, match="unresolvable CDI devices"):
            podman.reference_config(specs, [f"{kind}={name}"])
        ours_set = cdi.SpecSet([cdi.parse_spec(json.dumps(s), source=k) for k, s in specs.items()])
        with pytest.raises(exceptions.DeviceRequestError):
            cdi.edits_for_devices(ours_set, [f"{kind}={name}"])


def single_device_spec(kind: str, edits: dict) -> dict:
    return {
        "cdiVersion": "0.5.0",
        "kind": kind,
        "devices": [{"name": "d", "containerEdits": edits}],
    }


def test_unowned_nodes_take_the_process_owner_like_the_reference(podman, tmp_path):
    """A non-root actor (1000:1001) owns nodes the spec gives no uid/gid, as with the reference."""
    kind = cdi_oracle.unique_kind()
    spec = single_device_spec(
        kind, {"deviceNodes": [{"path": "/dev/null"}, {"path": "/dev/zero", "uid": 7, "gid": 8}]}
    )
    reference = podman.reference_config(
        {"spec": spec}, [f"{kind}=d"], create_args=("--user", "1000:1001")
    )
    mine = ours(tmp_path, _edits(spec), user=(1000, 1001))
    assert devices(mine) == devices(reference)
    assert ("/dev/null", "c", 1, 3, 1000, 1001) in devices(mine)


def _edits(spec: dict) -> cdi.ContainerEdits:
    return cdi.edits_for_devices(
        cdi.SpecSet([cdi.parse_spec(json.dumps(spec))]), [f"{spec['kind']}=d"]
    )


def test_fifo_gets_no_rule_like_the_reference(podman, tmp_path):
    """A FIFO node is passed with type p and no cgroup rule, as with the reference."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo, 0o600)
    kind = cdi_oracle.unique_kind()
    spec = single_device_spec(
        kind, {"deviceNodes": [{"path": "/dev/null"}, {"path": "/dev/pipe", "hostPath": str(fifo)}]}
    )
    reference = podman.reference_config({"spec": spec}, [f"{kind}=d"])
    mine = ours(tmp_path, _edits(spec))
    assert devices(mine) == devices(reference)
    assert rules(mine) == rules(reference) == [("c", 1, 3, "rwm")]


@pytest.mark.parametrize(
    ("node", "accepted"),
    [
        pytest.param({"type": "c", "major": 195}, True, id="complete-node-not-stat-ed"),
        pytest.param({"major": 195}, False, id="no-type-needs-the-host-node"),
    ],
)
def test_missing_host_node_like_the_reference(podman, tmp_path, node, accepted):
    """A node absent from the host is fine only when the spec gives its type and major."""
    kind = cdi_oracle.unique_kind()
    spec = single_device_spec(
        kind,
        {"deviceNodes": [{"path": "/dev/absent", "hostPath": str(tmp_path / "absent"), **node}]},
    )
    if accepted:
        reference = podman.reference_config({"spec": spec}, [f"{kind}=d"])
        assert devices(ours(tmp_path, _edits(spec))) == devices(reference)
    else:
        with pytest.raises(cdi_oracle.OracleRefused, match="failed to stat CDI host device"):
            podman.reference_config({"spec": spec}, [f"{kind}=d"])
        with pytest.raises(exceptions.DeviceResolutionError, match="cannot stat"):
            ours(tmp_path, _edits(spec))


def depth_groups(destinations: list[str]) -> list[tuple[int, frozenset[str]]]:
    """The depth of each run of same-depth destinations, in order, with its members."""
    groups: list[tuple[int, set[str]]] = []
    for destination in destinations:
        depth = os.path.normpath(destination).count("/")
        if not groups or groups[-1][0] != depth:
            groups.append((depth, set()))
        groups[-1][1].add(destination)
    return [(depth, frozenset(members)) for depth, members in groups]


def test_mount_replacement_and_order_match_the_reference(podman, tmp_path):
    """A spec mount at /dev/shm replaces podman's; all mounts are ordered by depth, as there."""
    shm = tmp_path / "shm"
    shm.mkdir()
    kind = cdi_oracle.unique_kind()
    spec = single_device_spec(
        kind,
        {
            "deviceNodes": [{"path": "/dev/null"}],
            "mounts": [
                {"hostPath": str(shm), "containerPath": "/dev/shm", "options": ["ro", "bind"]},
                {"hostPath": "/etc/hostname", "containerPath": "/a/b", "options": ["ro", "bind"]},
                {"hostPath": "/etc/hostname", "containerPath": "/b", "options": ["ro", "bind"]},
            ],
        },
    )
    reference = podman.reference_config({"spec": spec}, [f"{kind}=d"])
    # The mounts podman had before applying CDI: its own, minus its later userdata binds.
    base_destinations = {"/dev", "/proc", "/sys", "/dev/mqueue", "/dev/pts", "/dev/shm"}
    base = [
        {"destination": d, "type": "tmpfs", "source": "podman-default"}
        for d in sorted(base_destinations)
    ]
    mine = ours(tmp_path, _edits(spec), mounts=base)
    compared = base_destinations | {"/a/b", "/b"}
    order = [m["destination"] for m in reference["mounts"] if m["destination"] in compared]
    # podman 4.3's library predates the reference's v1.0.0 stable sort: it orders mounts of
    # the same depth by name. Both put every shallower mount first, so the depths and the
    # mounts at each depth agree; the order within a depth is checked against the
    # reference's own table (test_reference_edits.py).
    assert depth_groups([m["destination"] for m in mine["mounts"]]) == depth_groups(order)
    assert [m["source"] for m in mine["mounts"] if m["destination"] == "/dev/shm"] == [str(shm)]
    assert [m["source"] for m in reference["mounts"] if m["destination"] == "/dev/shm"] == [
        str(shm)
    ]


def test_empty_permissions_are_rwm_like_the_reference(podman, tmp_path):
    """``permissions: ""`` is the default ``rwm`` in podman 4.3's library as in v1.1.2."""
    kind = cdi_oracle.unique_kind()
    spec = single_device_spec(kind, {"deviceNodes": [{"path": "/dev/null", "permissions": ""}]})
    reference = podman.reference_config({"spec": spec}, [f"{kind}=d"])
    mine = ours(tmp_path, _edits(spec))
    assert rules(mine) == rules(reference) == [("c", 1, 3, "rwm")]


@pytest.mark.parametrize(
    ("node", "refusal"),
    [
        # Its cache drops the invalid spec, so the device is "unresolvable".
        pytest.param({"permissions": "none"}, "unresolvable CDI devices", id="none"),
        pytest.param({"type": "c", "major": -1, "minor": 3}, None, id="negative-major"),
    ],
)
def test_where_podmans_older_library_differs_from_v1_1_2(podman, tmp_path, node, refusal):
    """podman 4.3.1 embeds the pre-rename library (github.com/container-orchestrated-devices,
    v0.5 era): it refuses ``"none"`` (v1.1.1 added it) and accepts a negative major (v1.1.2
    refuses it). We follow v1.1.2 in both; this pins down the oracle's age, so a newer podman
    that agrees shows up as a failure to update these notes."""
    kind = cdi_oracle.unique_kind()
    spec = single_device_spec(kind, {"deviceNodes": [{"path": "/dev/null", **node}]})
    if refusal is not None:
        with pytest.raises(cdi_oracle.OracleRefused, match=refusal):
            podman.reference_config({"spec": spec}, [f"{kind}=d"])
        assert _edits(spec).device_nodes[0].permissions == "none"
        return
    reference = podman.reference_config({"spec": spec}, [f"{kind}=d"])
    assert ("c", -1, 3) in {r[:3] for r in rules(reference)}
    with pytest.raises(exceptions.CdiSpecError, match="negative device number"):
        _edits(spec)
