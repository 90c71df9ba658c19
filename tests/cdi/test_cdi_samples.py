"""Every real spec we hold parses, in every format nvidia-ctk writes, with the facts it contains."""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from support.cdi_samples import INVALID_SAMPLES, VALID_SAMPLES

from substrate_gpu import cdi
from substrate_gpu.exceptions import MigDeviceRefused

DATA = Path(__file__).resolve().parent.parent / "data" / "cdi"
T4_YAML = "real-world/kwx4957-study__ctk-1.20.0__drv-615.71.09__rocky9-T4.yaml"
T4_JSON = "derived/DERIVED__kwx4957-study__ctk-1.20.0__as-json-marshal.json"

# Samples whose cdiVersion is above the minimum their content needs (everything nvidia-ctk
# writes itself is exactly at the minimum; see PROVENANCE.md).
ABOVE_MINIMUM = {
    "real-world/docker-docs__g4dn-xlarge__drv-570.133.20__ctk-1.17.x.yaml",
    "cdi-repo/README-example__vendor.json",
    "cdi-repo/schema-HEAD/schema_testdata_good_spec-example.json",
}


def test_the_sample_tables_cover_every_spec_file() -> None:
    """Every .json/.yaml under tests/data/cdi is either a valid or an invalid sample."""
    on_disk = {
        str(p.relative_to(DATA))
        for p in DATA.rglob("*")
        if p.suffix in (".json", ".yaml") and p.name != "_index.json"
    }
    assert on_disk == set(VALID_SAMPLES) | INVALID_SAMPLES
    assert len(VALID_SAMPLES) == len(set(VALID_SAMPLES)) == 36


@pytest.mark.parametrize("relative", [pytest.param(r, id=r) for r in VALID_SAMPLES])
def test_real_spec_parses_strictly(relative: str, sample_text: Callable[[str], str]) -> None:
    """Every real spec parses, even in strict mode: they hold no field we do not know."""
    spec = cdi.parse_spec(sample_text(relative), source=relative, strict=True)
    assert spec.source == relative
    assert spec.ignored_fields == ()
    assert spec.devices
    if relative not in ABOVE_MINIMUM:
        assert spec.cdi_version == cdi.minimum_required(spec).version


def is_management_spec(relative: str) -> bool:
    """`--mode management` specs (and the installer's) hold every MIG capability node."""
    return "enableChmodHook" in relative or "installer_toolkit" in relative


@pytest.mark.parametrize(
    "relative",
    [
        pytest.param(r, id=r)
        for r in VALID_SAMPLES
        # A DRA claim spec holds only the claim's devices: no `all`.
        if "imex" not in r
        and "cdi-repo" not in r
        and "dra-claim" not in r
        and not is_management_spec(r)
    ],
)
def test_every_nvidia_spec_has_an_all_device_with_nodes(
    relative: str, sample_text: Callable[[str], str]
) -> None:
    """Every GPU spec nvidia-ctk wrote resolves edits for `all` with at least one device node."""
    spec = cdi.parse_spec(sample_text(relative))
    assert spec.device("all") is not None
    assert cdi.edits_for_all(spec).device_nodes


@pytest.mark.parametrize(
    "relative",
    [pytest.param(r, id=r) for r in VALID_SAMPLES if is_management_spec(r)],
)
def test_management_spec_all_is_refused_for_its_mig_capability_nodes(
    relative: str, sample_text: Callable[[str], str]
) -> None:
    """Management specs put /dev/nvidia-caps/nvidia-cap1 (MIG config) in `all`: refused."""
    spec = cdi.parse_spec(sample_text(relative))
    with pytest.raises(MigDeviceRefused, match="/dev/nvidia-caps/nvidia-cap1.*no MIG support"):
        cdi.edits_for_all(spec)


def test_load_spec_reads_a_file_and_names_it() -> None:
    """load_spec parses a file from disk and records its path as the source."""
    path = DATA / T4_YAML
    spec = cdi.load_spec(path)
    assert spec.source == str(path)
    assert spec == cdi.parse_spec(path.read_bytes(), source=str(path))


class TestT4Spec:
    """Concrete facts of the real 1.20.0 spec from a Tesla T4 node (driver 615.71.09)."""

    @pytest.fixture
    def spec(self, sample_text: Callable[[str], str]) -> cdi.Spec:
        return cdi.parse_spec(sample_text(T4_YAML))

    def test_header(self, spec: cdi.Spec) -> None:
        """Version and kind are read as written."""
        assert (spec.cdi_version, spec.kind) == ("0.7.0", "nvidia.com/gpu")

    def test_device_names(self, spec: cdi.Spec) -> None:
        """Per-index, per-UUID and `all` devices, in file order."""
        assert [d.name for d in spec.devices] == [
            "0",
            "GPU-8f1f4d06-07fd-27a7-52d5-e58aa060d256",
            "all",
        ]

    def test_spec_level_edits(self, spec: cdi.Spec) -> None:
        """Spec-level env, 3 control nodes, 50 mounts, 6 createContainer hooks."""
        edits = spec.container_edits
        assert edits.env == ("NVIDIA_CTK_LIBCUDA_DIR=/usr/lib64", "NVIDIA_VISIBLE_DEVICES=void")
        assert [n.path for n in edits.device_nodes] == [
            "/dev/nvidia-uvm",
            "/dev/nvidia-uvm-tools",
            "/dev/nvidiactl",
        ]
        assert len(edits.mounts) == 50
        assert {m.options for m in edits.mounts} == {("ro", "nosuid", "nodev", "rbind", "rprivate")}
        assert {m.type for m in edits.mounts} == {None}

    def test_hook_subcommands(self, spec: cdi.Spec) -> None:
        """The five default hook subcommands of toolkit 1.20, all createContainer, argv[0] kept."""
        hooks = spec.container_edits.hooks
        assert {h.hook_name for h in hooks} == {"createContainer"}
        assert {h.path for h in hooks} == {"/usr/bin/nvidia-cdi-hook"}
        assert [h.args[:2] for h in hooks] == [
            ("nvidia-cdi-hook", "create-symlinks"),
            ("nvidia-cdi-hook", "create-symlinks"),
            ("nvidia-cdi-hook", "enable-cuda-compat"),
            ("nvidia-cdi-hook", "update-ldcache"),
            ("nvidia-cdi-hook", "disable-device-node-modification"),
            ("nvidia-cdi-hook", "update-application-profile"),
        ]
        assert hooks[2].args[2] == "--host-driver-version=615.71.09"
        assert hooks[3].args[2:] == ("--folder", "/usr/lib64", "--folder", "/usr/lib64/vdpau")
        assert hooks[0].env == ("NVIDIA_CTK_DEBUG=false",)

    def test_device_numbers_as_given(self, spec: cdi.Spec) -> None:
        """major/minor/fileMode/gid are kept; an omitted minor stays None (meaning 0)."""
        nodes = {n.path: n for n in spec.container_edits.device_nodes}
        assert (nodes["/dev/nvidiactl"].major, nodes["/dev/nvidiactl"].minor) == (195, 255)
        assert (nodes["/dev/nvidia-uvm"].major, nodes["/dev/nvidia-uvm"].minor) == (234, None)
        assert nodes["/dev/nvidia-uvm"].file_mode == 0o666
        all_device = spec.device("all")
        assert all_device is not None
        all_nodes = {n.path: n for n in all_device.container_edits.device_nodes}
        assert (all_nodes["/dev/nvidia0"].major, all_nodes["/dev/nvidia0"].minor) == (195, None)
        render = all_nodes["/dev/dri/renderD128"]
        assert (render.major, render.minor, render.gid) == (226, 128, 105)
        assert all_nodes["/dev/dri/card0"].file_mode == 0o660
        assert all_device.container_edits.additional_gids == (39,)

    def test_json_marshal_form_is_the_same_spec(
        self, spec: cdi.Spec, sample_text: Callable[[str], str]
    ) -> None:
        """The compact json.Marshal rendering parses to exactly the same values as the YAML."""
        from_json = cdi.parse_spec(sample_text(T4_JSON))
        assert dataclasses.replace(from_json, source=spec.source) == spec


def test_yaml_and_json_renderings_of_the_golden_spec_agree(
    sample_text: Callable[[str], str],
) -> None:
    """NVIDIA's 1.20 golden YAML, and its derived YAML/JSON copies, give one and the same spec."""
    golden = (DATA / "nvidia-toolkit-tests/v1.20.0__generate_test__default.yaml").read_text()
    expected = cdi.parse_spec(golden.replace("{{ .driverRoot }}", "/DRIVER_ROOT"))
    for derived in ("yaml", "json"):
        text = sample_text(
            f"derived/DERIVED__v1.20.0__generate_test__default__driverRoot=DRIVER_ROOT.{derived}"
        )
        assert cdi.parse_spec(text) == expected


@pytest.mark.parametrize(
    ("relative", "style"),
    [
        pytest.param(
            "real-world/salilkadam-Infrastructure__ctk-1.17.8__drv-575.64.03__1gpu.yaml",
            "---",
            id="yaml-ctk-1.17-alphabetical",
        ),
        pytest.param(
            T4_YAML,
            "---\ncdiVersion: 0.7.0\nkind: nvidia.com/gpu\ndevices:\n    - ",
            id="yaml-ctk-1.20-4-space",
        ),
        pytest.param("real-world/ramalama/CDI_JSON_2.json", '{"cdiVersion"', id="json-compact"),
        pytest.param("project-oak/cdi.json", "{\n", id="json-pretty"),
    ],
)
def test_every_style_nvidia_ctk_writes(
    relative: str, style: str, sample_text: Callable[[str], str]
) -> None:
    """Each style (its opening bytes checked here) parses from str and from bytes alike."""
    text = sample_text(relative)
    assert text.startswith(style)
    spec = cdi.parse_spec(text)
    assert cdi.parse_spec(text.encode()) == spec
    assert cdi.parse_spec(b"\xef\xbb\xbf" + text.encode()) == spec, "a UTF-8 BOM is tolerated"


def test_compact_json_has_no_trailing_newline() -> None:
    """The json.Marshal samples really end without a newline (the case we claim to cover)."""
    assert not (DATA / "real-world/ramalama/CDI_JSON_2.json").read_bytes().endswith(b"\n")
    assert not (DATA / T4_JSON).read_bytes().endswith(b"\n")


@pytest.mark.parametrize(
    ("relative", "budget_ms"),
    [pytest.param(T4_JSON, 10.0, id="json"), pytest.param(T4_YAML, 30.0, id="yaml")],
)
def test_parsing_the_t4_spec_is_cheap(relative: str, budget_ms: float) -> None:
    """The 19 KB T4 spec parses in a few ms (generous bound: guards against quadratic walks).

    CPU time, not wall time: on a loaded CI machine other processes stretch the wall clock."""
    data = (DATA / relative).read_bytes()
    timings = []
    for _ in range(7):
        start = time.process_time()
        cdi.parse_spec(data)
        timings.append((time.process_time() - start) * 1000)
    assert statistics.median(timings) < budget_ms
