"""Named devices: qualified names, resolution across specs, per-GPU edits, GPU listing, MIG."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from support import gpu_specs

from substrate_gpu import cdi
from substrate_gpu.exceptions import DeviceRequestError, MigDeviceRefused

FOUR_GPUS = gpu_specs.with_gpus(gpu_specs.load_raw(), 4)


def parse(raw: dict, source: str = "t.json") -> cdi.Spec:
    return cdi.parse_spec(json.dumps(raw), source=source)


def simple_spec(kind: str, devices: dict[str, list[str]], **spec_edits: object) -> dict:
    """A spec of ``kind`` whose devices each hold the given device node paths."""
    raw: dict[str, object] = {
        "cdiVersion": "0.5.0",
        "kind": kind,
        "devices": [
            {"name": name, "containerEdits": {"deviceNodes": [{"path": p} for p in paths]}}
            for name, paths in devices.items()
        ],
    }
    if spec_edits:
        raw["containerEdits"] = spec_edits
    return raw


@pytest.fixture(scope="module")
def four() -> cdi.SpecSet:
    return cdi.SpecSet([parse(FOUR_GPUS)])


# --------------------------------------------------------------------------- names


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("nvidia.com/gpu=0", ("nvidia.com", "gpu", "0"), id="index"),
        pytest.param(
            "nvidia.com/gpu=GPU-8f1f4d06-07fd-27a7-52d5-e58aa060d256",
            ("nvidia.com", "gpu", "GPU-8f1f4d06-07fd-27a7-52d5-e58aa060d256"),
            id="uuid",
        ),
        pytest.param(
            "k8s.gpu.nvidia.com/claim=6b3f-gpu-0",
            ("k8s.gpu.nvidia.com", "claim", "6b3f-gpu-0"),
            id="dra-claim",
        ),
        pytest.param("vendor.com/class=dev:1", ("vendor.com", "class", "dev:1"), id="colon"),
    ],
)
def test_qualified_names_parse(text, expected):
    """vendor/class=name splits at the first '=' and the first '/'."""
    name = cdi.parse_qualified_name(text)
    assert (name.vendor, name.class_, name.name) == expected
    assert str(name) == text


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        pytest.param("0", "no '='", id="bare-name"),
        pytest.param("nvidia.com=0", "no vendor/class", id="no-class"),
        pytest.param("/gpu=0", "invalid vendor ''", id="empty-vendor"),
        pytest.param("nvidia.com/=0", "invalid class ''", id="empty-class"),
        pytest.param("nvidia.com/gpu=", "invalid device name ''", id="empty-name"),
        pytest.param("nvidia.com/gpu=-0", "invalid device name", id="name-starts-with-dash"),
        pytest.param("nvidia.com/gpu=a/b", "invalid device name", id="slash-in-name"),
        pytest.param("1vendor.com/gpu=0", "invalid vendor", id="vendor-starts-with-digit"),
    ],
)
def test_malformed_names_are_refused(text, problem):
    """A name that is not vendor/class=name is a DeviceRequestError saying what is wrong."""
    with pytest.raises(DeviceRequestError, match=problem) as caught:
        cdi.parse_qualified_name(text)
    assert repr(text) in str(caught.value)


# --------------------------------------------------------------------------- edits


def test_one_gpu_gets_spec_edits_and_only_its_own_nodes(four):
    """GPU 2: the spec-level control nodes plus GPU 2's nodes, nothing of GPUs 0, 1, 3."""
    edits = cdi.edits_for_devices(four, ["nvidia.com/gpu=2"])
    assert [n.path for n in edits.device_nodes] == [
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
        "/dev/nvidiactl",
        "/dev/nvidia2",
        "/dev/dri/card2",
        "/dev/dri/renderD130",
    ]
    spec = four.specs[0]
    assert edits.mounts == spec.container_edits.mounts
    assert edits.env == spec.container_edits.env
    # The spec's hooks, then GPU 2's create-symlinks for its DRI by-path links.
    assert len(edits.hooks) == len(spec.container_edits.hooks) + 1
    assert "pci-0000:00:06.0-card" in edits.hooks[-1].args[3]


def test_uuid_name_gives_the_same_edits_as_the_index_name(four):
    """nvidia.com/gpu=GPU-<uuid> and nvidia.com/gpu=<index> are the same GPU."""
    by_uuid = cdi.edits_for_devices(four, [f"nvidia.com/gpu={gpu_specs.gpu_uuid(2)}"])
    assert by_uuid == cdi.edits_for_devices(four, ["nvidia.com/gpu=2"])


def test_several_gpus_in_request_order(four):
    """Two GPUs: spec-level edits once, then each GPU's edits in the order requested."""
    edits = cdi.edits_for_devices(four, ["nvidia.com/gpu=3", "nvidia.com/gpu=1"])
    gpus = [n.path for n in edits.device_nodes if n.path[len("/dev/nvidia") :].isdigit()]
    assert gpus == ["/dev/nvidia3", "/dev/nvidia1"]
    assert len([n for n in edits.device_nodes if n.path == "/dev/nvidiactl"]) == 1


def test_a_name_requested_twice_counts_once(four):
    """Duplicates in a request do not duplicate edits."""
    once = cdi.edits_for_devices(four, ["nvidia.com/gpu=1"])
    assert cdi.edits_for_devices(four, ["nvidia.com/gpu=1", "nvidia.com/gpu=1"]) == once


def test_one_gpu_by_its_index_and_its_uuid_counts_once(four):
    """Two names of one GPU (nvidia-ctk's index and UUID entries, the same edits): that
    GPU's edits once, as the CDI reference library's result holds each node once."""
    gpu = cdi.list_gpus(four)[1]
    (uuid,) = [n for n in gpu.names if "=GPU-" in n]
    once = cdi.edits_for_devices(four, ["nvidia.com/gpu=1"])
    assert cdi.edits_for_devices(four, ["nvidia.com/gpu=1", uuid]) == once
    assert cdi.edits_for_devices(four, [uuid, "nvidia.com/gpu=1"]) == cdi.edits_for_devices(
        four, [uuid]
    )


@pytest.mark.parametrize(
    "names",
    [
        pytest.param(["nvidia.com/gpu=all", "nvidia.com/gpu=1"], id="all-then-an-index"),
        pytest.param(["nvidia.com/gpu=1", "nvidia.com/gpu=all"], id="an-index-then-all"),
        pytest.param(["nvidia.com/gpu=all", "nvidia.com/gpu=all"], id="all-twice"),
    ],
)
def test_all_beside_other_names_is_all(four, names):
    """``all`` with a GPU's name beside it is ``all``: every node once, no hook twice."""
    assert cdi.edits_for_devices(four, names) == cdi.edits_for_all(four.specs[0])


def test_all_by_name_is_the_all_path(four):
    """Requesting nvidia.com/gpu=all gives exactly what edits_for_all gives."""
    assert cdi.edits_for_devices(four, ["nvidia.com/gpu=all"]) == cdi.edits_for_all(four.specs[0])


def test_devices_of_two_specs_get_each_spec_level_edits_once():
    """Each spec's containerEdits are applied once, before its first requested device."""
    gpu = parse(simple_spec("a.com/gpu", {"0": ["/dev/a0"], "1": ["/dev/a1"]}, env=["A=1"]), "a")
    nic = parse(simple_spec("b.com/nic", {"x": ["/dev/bx"]}, env=["B=1"]), "b")
    edits = cdi.edits_for_devices(
        cdi.SpecSet([gpu, nic]), ["b.com/nic=x", "a.com/gpu=1", "a.com/gpu=0"]
    )
    assert edits.env == ("B=1", "A=1")
    assert [n.path for n in edits.device_nodes] == ["/dev/bx", "/dev/a1", "/dev/a0"]


def test_the_parsed_specs_are_not_changed(four):
    """Resolution builds new values; the shared specs stay as parsed."""
    before = parse(FOUR_GPUS)
    cdi.edits_for_devices(four, ["nvidia.com/gpu=0", "nvidia.com/gpu=3"])
    assert four.specs[0] == before


# --------------------------------------------------------------------------- errors


def test_unknown_name_lists_what_exists(four):
    """An unknown device names itself and every device of its kind."""
    with pytest.raises(DeviceRequestError) as caught:
        cdi.edits_for_devices(four, ["nvidia.com/gpu=7", "nvidia.com/gpu=2"])
    message = str(caught.value)
    assert "unknown CDI device nvidia.com/gpu=7" in message
    assert "nvidia.com/gpu offers: 0, GPU-" in message
    assert ", 3, " in message and message.endswith("all")


def test_every_unknown_name_is_listed(four):
    """Several unknown names are reported together, not one per attempt."""
    with pytest.raises(DeviceRequestError, match=r"devices nvidia.com/gpu=7, nvidia.com/gpu=9"):
        cdi.edits_for_devices(four, ["nvidia.com/gpu=7", "nvidia.com/gpu=9"])


def test_unknown_kind_lists_the_kinds(four):
    """A kind no spec defines says so and lists the kinds there are."""
    with pytest.raises(
        DeviceRequestError, match=r"no spec defines kind amd.com/gpu \(kinds: nvidia.com/gpu\)"
    ):
        cdi.edits_for_devices(four, ["amd.com/gpu=0"])


def test_empty_request_is_refused(four):
    """Asking for nothing is an error, not an actor without GPUs."""
    with pytest.raises(DeviceRequestError, match="no device was requested"):
        cdi.edits_for_devices(four, [])


def test_device_without_nodes_is_refused():
    """A request whose edits hold no device node would give no GPU: refused."""
    raw = {
        "cdiVersion": "0.5.0",
        "kind": "a.com/gpu",
        "devices": [{"name": "e", "containerEdits": {"env": ["X=1"]}}],
    }
    with pytest.raises(DeviceRequestError, match="hold no device node"):
        cdi.edits_for_devices(cdi.SpecSet([parse(raw)]), ["a.com/gpu=e"])


def test_same_name_in_two_specs_of_one_priority_is_a_conflict():
    """Two specs defining a.com/gpu=0 at the same priority: requesting it names both files."""
    first = parse(
        simple_spec("a.com/gpu", {"0": ["/dev/a0"], "1": ["/dev/a1"]}), "/etc/cdi/one.json"
    )
    second = parse(simple_spec("a.com/gpu", {"0": ["/dev/z0"]}), "/etc/cdi/two.json")
    specs = cdi.SpecSet([first, second])
    with pytest.raises(
        DeviceRequestError,
        match=r"a.com/gpu=0: it is defined by several specs.*one.json, /etc/cdi/two.json",
    ):
        cdi.edits_for_devices(specs, ["a.com/gpu=0"])
    # The other names of those specs stay usable, as in the reference.
    assert [n.path for n in cdi.edits_for_devices(specs, ["a.com/gpu=1"]).device_nodes] == [
        "/dev/a1"
    ]


def test_higher_priority_spec_wins_over_a_lower_one():
    """/var/run/cdi (later directory, higher priority) overrides /etc/cdi for the same name."""
    low = parse(simple_spec("a.com/gpu", {"0": ["/dev/old"]}), "/etc/cdi/a.json")
    high = parse(simple_spec("a.com/gpu", {"0": ["/dev/new"]}), "/var/run/cdi/a.json")
    specs = cdi.SpecSet([low, high], priorities=[0, 1])
    assert [n.path for n in cdi.edits_for_devices(specs, ["a.com/gpu=0"]).device_nodes] == [
        "/dev/new"
    ]


# --------------------------------------------------------------------------- MIG


MIG_SPEC = {
    "cdiVersion": "0.5.0",
    "kind": "nvidia.com/gpu",
    "devices": [
        {"name": "0", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0"}]}},
        {"name": "1", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia1"}]}},
        {
            "name": "1:0",
            "containerEdits": {
                "deviceNodes": [
                    {"path": "/dev/nvidia1"},
                    {"path": "/dev/nvidia-caps/nvidia-cap21"},
                    {"path": "/dev/nvidia-caps/nvidia-cap22"},
                ]
            },
        },
        {
            "name": "MIG-5c89852c-d268-5d7b-9c49-8f2b3e1b7a0e",
            "containerEdits": {
                "deviceNodes": [{"path": "/dev/nvidia1"}, {"path": "/dev/nvidia-caps/nvidia-cap21"}]
            },
        },
        {"name": "mig1:0", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia1"}]}},
        {
            "name": "claim-7",
            "containerEdits": {
                "deviceNodes": [{"path": "/dev/nvidia1"}, {"path": "/dev/nvidia-caps/nvidia-cap30"}]
            },
        },
        {
            "name": "all",
            "containerEdits": {
                "deviceNodes": [
                    {"path": "/dev/nvidia0"},
                    {"path": "/dev/nvidia1"},
                    {"path": "/dev/nvidia-caps/nvidia-cap21"},
                ]
            },
        },
    ],
    "containerEdits": {"deviceNodes": [{"path": "/dev/nvidiactl"}]},
}


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        pytest.param("1:0", "name '1:0' is a MIG device name", id="index-strategy"),
        pytest.param(
            "MIG-5c89852c-d268-5d7b-9c49-8f2b3e1b7a0e", "is a MIG device name", id="uuid-strategy"
        ),
        pytest.param("mig1:0", "name 'mig1:0' is a MIG device name", id="type-index-strategy"),
        pytest.param(
            "claim-7", "MIG capability node /dev/nvidia-caps/nvidia-cap30", id="caps-node"
        ),
        pytest.param(
            "all", "MIG capability node /dev/nvidia-caps/nvidia-cap21", id="all-on-mig-node"
        ),
    ],
)
def test_mig_devices_are_refused_with_the_reason(name, reason):
    """MIG devices, by name or by capability node, are refused: nvproxy has no MIG support."""
    specs = cdi.SpecSet([parse(MIG_SPEC)])
    with pytest.raises(MigDeviceRefused, match=f"{reason}.*nvproxy.*no MIG support"):
        cdi.edits_for_devices(specs, [f"nvidia.com/gpu={name}"])


def test_full_gpu_next_to_a_mig_gpu_is_fine():
    """GPU 0 (MIG off) is injectable on a node whose GPU 1 has MIG on."""
    edits = cdi.edits_for_devices(cdi.SpecSet([parse(MIG_SPEC)]), ["nvidia.com/gpu=0"])
    assert [n.path for n in edits.device_nodes] == ["/dev/nvidiactl", "/dev/nvidia0"]


def test_imex_channels_are_not_mig():
    """/dev/nvidia-caps-imex-channels is another directory: not refused."""
    raw = simple_spec("nvidia.com/imex-channel", {"0": ["/dev/nvidia-caps-imex-channels/channel0"]})
    edits = cdi.edits_for_devices(cdi.SpecSet([parse(raw)]), ["nvidia.com/imex-channel=0"])
    assert len(edits.device_nodes) == 1


# --------------------------------------------------------------------------- listing


def test_gpus_of_the_real_t4_spec():
    """The real T4 spec has one GPU: index 0, its UUID, /dev/nvidia0."""
    (gpu,) = cdi.list_gpus(cdi.SpecSet([cdi.load_spec(gpu_specs.T4_SPEC)]))
    assert gpu == cdi.Gpu(
        name="nvidia.com/gpu=0",
        index=0,
        uuid="GPU-8f1f4d06-07fd-27a7-52d5-e58aa060d256",
        node="/dev/nvidia0",
        names=("nvidia.com/gpu=0", "nvidia.com/gpu=GPU-8f1f4d06-07fd-27a7-52d5-e58aa060d256"),
    )


def test_gpus_are_listed_by_index():
    """Order is by index (numeric, not text), whatever the spec order."""
    raw = gpu_specs.with_gpus(gpu_specs.load_raw(), 12)
    raw["devices"].reverse()
    gpus = cdi.list_gpus(cdi.SpecSet([parse(raw)]))
    assert [g.index for g in gpus] == list(range(12))
    assert [g.node for g in gpus][:3] == ["/dev/nvidia0", "/dev/nvidia1", "/dev/nvidia2"]
    assert gpus[10].uuid == gpu_specs.gpu_uuid(10)


def test_uuid_only_spec_lists_gpus_by_uuid_in_node_order():
    """--device-name-strategy=uuid: no index, named by UUID, ordered by node number."""
    raw = simple_spec(
        "nvidia.com/gpu",
        {
            "GPU-b": ["/dev/nvidia3"],
            "GPU-a": ["/dev/nvidia1"],
            "all": ["/dev/nvidia1", "/dev/nvidia3"],
        },
    )
    gpus = cdi.list_gpus(cdi.SpecSet([parse(raw)]))
    assert [(g.name, g.index, g.uuid) for g in gpus] == [
        ("nvidia.com/gpu=GPU-a", None, "GPU-a"),
        ("nvidia.com/gpu=GPU-b", None, "GPU-b"),
    ]


def test_type_index_names_give_the_index():
    """--device-name-strategy=type-index names GPUs gpu<N>."""
    raw = simple_spec("nvidia.com/gpu", {"gpu1": ["/dev/nvidia1"], "gpu0": ["/dev/nvidia0"]})
    assert [(g.name, g.index) for g in cdi.list_gpus(cdi.SpecSet([parse(raw)]))] == [
        ("nvidia.com/gpu=gpu0", 0),
        ("nvidia.com/gpu=gpu1", 1),
    ]


def test_gpu_in_mig_mode_is_not_listed():
    """GPU 1 has MIG devices: only GPU 0 can be handed out whole."""
    assert [g.name for g in cdi.list_gpus(cdi.SpecSet([parse(MIG_SPEC)]))] == ["nvidia.com/gpu=0"]


def test_listing_other_kinds_is_explicit(four):
    """Only the asked kind is listed (nvidia.com/gpu by default)."""
    assert cdi.list_gpus(four, kind="amd.com/gpu") == ()
    assert len(cdi.list_gpus(four)) == 4


# --------------------------------------------------------------------------- loading


def write(path: Path, raw: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(raw))
    return path


def test_spec_dirs_are_read_with_later_directories_winning(tmp_path):
    """Both directories' specs are known; for the same name the later directory wins."""
    write(tmp_path / "etc/a.json", simple_spec("a.com/gpu", {"0": ["/dev/old"], "9": ["/dev/a9"]}))
    write(tmp_path / "run/a.json", simple_spec("a.com/gpu", {"0": ["/dev/new"]}))
    (tmp_path / "run/notes.txt").write_text("not a spec")
    specs = cdi.load_spec_set([tmp_path / "etc", tmp_path / "run", tmp_path / "absent"])
    assert [
        n.path for n in cdi.edits_for_devices(specs, ["a.com/gpu=0", "a.com/gpu=9"]).device_nodes
    ] == ["/dev/new", "/dev/a9"]
    assert specs.errors == ()


def test_a_broken_spec_file_is_left_out_and_named_in_errors(tmp_path):
    """One unparsable file does not hide the others; an unknown-name error mentions it."""
    write(tmp_path / "good.json", simple_spec("a.com/gpu", {"0": ["/dev/a0"]}))
    (tmp_path / "broken.yaml").write_text("cdiVersion: [")
    specs = cdi.load_spec_set([tmp_path])
    assert cdi.edits_for_devices(specs, ["a.com/gpu=0"]).device_nodes
    with pytest.raises(
        DeviceRequestError, match=r"left out for errors: invalid CDI spec .*broken.yaml"
    ):
        cdi.edits_for_devices(specs, ["b.com/gpu=0"])


def test_the_worker_spec_is_not_read_twice(tmp_path):
    """The generated spec given as extra, lying in a scanned directory, is not a conflict."""
    path = write(tmp_path / "nvidia.json", FOUR_GPUS)
    worker = cdi.load_spec(path)
    specs = cdi.load_spec_set([tmp_path], extra=[worker])
    assert specs.specs == (worker,)
    assert cdi.edits_for_devices(specs, ["nvidia.com/gpu=1"]).device_nodes


def test_unchanged_files_are_not_parsed_again(tmp_path):
    """SpecDirReader returns the same Spec object until the file changes."""
    path = write(tmp_path / "a.json", simple_spec("a.com/gpu", {"0": ["/dev/a0"]}))
    reader = cdi.SpecDirReader([tmp_path])
    first = reader.read().specs[0]
    assert reader.read().specs[0] is first
    write(path, simple_spec("a.com/gpu", {"0": ["/dev/a1"]}))
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 1_000_000))
    changed = reader.read().specs[0]
    assert changed is not first
    assert changed.devices[0].container_edits.device_nodes[0].path == "/dev/a1"


def test_the_worker_spec_may_be_given_by_path(tmp_path):
    """``extra=[path]`` reads the spec there (it used to fail with an AttributeError)."""
    path = write(tmp_path / "worker" / "nvidia.json", FOUR_GPUS)
    specs = cdi.load_spec_set([tmp_path / "etc"], extra=[path])
    assert [s.source for s in specs.specs] == [str(path)]
    assert cdi.edits_for_devices(specs, ["nvidia.com/gpu=1"]).device_nodes
