"""The ``inject``, ``cdi show`` and ``demo`` commands."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.gpu_nodes import generate_spec

from substrate_gpu.cli import _inject, main
from substrate_gpu.testing import bundles
from substrate_gpu.testing import node as node_

DATA = Path(__file__).resolve().parents[1] / "data" / "cdi"
T4 = DATA / "real-world" / "kwx4957-study__ctk-1.20.0__drv-615.71.09__rocky9-T4.yaml"


def test_cdi_show_prints_what_would_be_injected(capsys):
    """cdi show lists the nodes with where their numbers come from, and hook verdicts."""
    assert main(["cdi", "show", str(T4), "--driver-root", "/usr"]) == 0
    out = capsys.readouterr().out
    assert "Device nodes (6)" in out
    assert "/dev/nvidiactl         c     195:255      rwm     spec" in out
    assert "Mounts (50)" in out
    assert "skip     update-ldcache" in out
    assert "keep     enable-cuda-compat" in out
    assert "NVIDIA_VISIBLE_DEVICES=void" not in out


DRA_CLAIM = DATA / "derived" / "DERIVED__dra-claim__kwx4957-T4__gpu-0.yaml"
T4_1202 = DATA / "derived" / "DERIVED__kwx4957-T4__ctk-1.20.2-shape.yaml"
CLAIM_DEVICE = "k8s.gpu.nvidia.com/claim=dab5ab50-d59a-42a6-af16-cfd4628c0f7a-gpu-0"


def test_cdi_show_of_a_dra_claim_spec_shows_its_devices(capsys):
    """A DRA claim's spec has no `all`: shown as every device of the spec, not refused."""
    assert main(["cdi", "show", str(DRA_CLAIM), "--driver-root", "/usr"]) == 0
    out = capsys.readouterr().out
    assert "injecting: spec-level edits + every device; the spec has no 'all'" in out
    assert "Device nodes (6)" in out
    assert "/dev/nvidia0           c     195:0        rwm     spec" in out


def test_cdi_show_of_named_devices_shows_only_them(capsys):
    """--device shows what inject --device would inject (the claim's name, or an index)."""
    assert main(["cdi", "show", str(DRA_CLAIM), "--device", CLAIM_DEVICE]) == 0
    assert f"(injecting: {CLAIM_DEVICE})" in capsys.readouterr().out
    assert main(["cdi", "show", str(T4), "--device", "nvidia.com/gpu=0"]) == 0
    assert "(injecting: nvidia.com/gpu=0)" in capsys.readouterr().out


def test_cdi_show_of_an_unknown_device_exits_1_listing_the_offer(capsys):
    """A name the spec does not define: one line naming it and what the kind offers."""
    assert main(["cdi", "show", str(T4), "--device", "nvidia.com/gpu=7"]) == 1
    err = capsys.readouterr().err
    assert "unknown CDI device nvidia.com/gpu=7; nvidia.com/gpu offers: 0," in err
    assert len(err.strip().splitlines()) == 1


def test_cdi_show_device_from_a_cdi_dir(tmp_path, capsys):
    """--cdi-dir resolves a --device name defined by another spec file, as inject does."""
    cdi_dir = tmp_path / "cdi"
    cdi_dir.mkdir()
    (cdi_dir / "claim.yaml").write_bytes(DRA_CLAIM.read_bytes())
    argv = ["cdi", "show", str(T4), "--cdi-dir", str(cdi_dir), "--device", CLAIM_DEVICE]
    assert main(argv) == 0
    assert f"(injecting: {CLAIM_DEVICE})" in capsys.readouterr().out


def test_cdi_show_of_a_1_20_2_spec_tables_its_new_hook_and_mounts(capsys):
    """Toolkit 1.20.2's shape: the createRuntime memory hook skipped with its reason, the
    void mount and the R615 ucode firmware listed as mounts."""
    assert main(["cdi", "show", str(T4_1202), "--driver-root", "/usr"]) == 0
    out = capsys.readouterr().out
    assert "Mounts (52)" in out
    assert "/var/run/nvidia-container-devices/void" in out
    assert "/lib/firmware/nvidia/615.71.09/ucodes_tu10x.bin" in out
    assert "skip     apply-cuda-memory-limits          createRuntime    a createRuntime hook" in out
    assert "keep     enable-cuda-compat                createContainer  allowlisted" in out


def test_cdi_show_names_a_node_without_access(tmp_path, capsys):
    """permissions: none (CDI v1.1.1+) shows as an access of none, with no cgroup rule."""
    spec = {
        "cdiVersion": "0.5.0",
        "kind": "vendor.com/device",
        "devices": [
            {
                "name": "all",
                "containerEdits": {
                    "deviceNodes": [
                        {"path": "/dev/vendorctl", "type": "c", "major": 7, "permissions": "none"},
                        {"path": "/dev/vendor0", "type": "c", "major": 7, "minor": 1},
                    ]
                },
            }
        ],
    }
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    assert main(["cdi", "show", str(path)]) == 0
    out = capsys.readouterr().out
    assert "/dev/vendorctl  c     7:0          none (no rule)  spec" in out
    assert "/dev/vendor0    c     7:1          rwm             spec" in out


def test_inject_from_a_spec_file_then_again(gpu_node, node_spec, tmp_path, capsys):
    """inject writes the bundle once; the second run reports already-injected."""
    bundle = bundles.make_bundle(tmp_path / "b", ["true"])
    argv = [
        "inject",
        "--bundle",
        str(bundle),
        "--cdi-spec",
        node_spec.source,
        "--driver-root",
        str(gpu_node.driver_root),
        "--dev-root",
        str(gpu_node.root),
        "--toolkit-dir",
        str(gpu_node.toolkit_dir),
    ]
    assert main(argv) == 0
    assert capsys.readouterr().out.startswith(f"injected: {bundle}")
    assert len(json.loads((bundle / "config.json").read_text())["linux"]["devices"]) == 4
    assert main(argv) == 0
    assert capsys.readouterr().out.startswith("already-injected")


def test_inject_with_generate_runs_the_toolkit(gpu_node, tmp_path, capsys, monkeypatch):
    """inject --generate runs the mounted toolkit's nvidia-ctk first."""
    # The knob --help documents is the one the stand-in honours.
    monkeypatch.setenv(_inject.STANDIN_SYSTEM_ROOT_ENV, str(gpu_node.root))
    bundle = bundles.make_bundle(tmp_path / "b", ["true"])
    assert (
        main(
            [
                "inject",
                "--bundle",
                str(bundle),
                "--generate",
                "--cdi-output-dir",
                str(tmp_path / "cdi"),
                "--driver-root",
                str(gpu_node.driver_root),
                "--dev-root",
                str(gpu_node.root),
                "--toolkit-dir",
                str(gpu_node.toolkit_dir),
            ]
        )
        == 0
    )
    assert (tmp_path / "cdi" / "nvidia.json").is_file()


def test_inject_failure_exits_1_with_the_reason(tmp_path, capsys):
    """A bundle without config.json fails with exit 1 and the path in the message."""
    assert main(["inject", "--bundle", str(tmp_path), "--cdi-spec", str(T4)]) == 1
    assert f"{tmp_path}/config.json" in capsys.readouterr().err


def test_inject_needs_a_spec_source(tmp_path):
    """Neither --cdi-spec nor --generate is a usage error (exit 2)."""
    with pytest.raises(SystemExit) as exit_info:
        main(["inject", "--bundle", str(tmp_path)])
    assert exit_info.value.code == 2


def inject_argv(gpu_node, spec_source: str, bundle: Path, *extra: str) -> list[str]:
    return [
        "inject",
        "--bundle",
        str(bundle),
        "--cdi-spec",
        spec_source,
        "--driver-root",
        str(gpu_node.driver_root),
        "--dev-root",
        str(gpu_node.root),
        "--toolkit-dir",
        str(gpu_node.toolkit_dir),
        *extra,
    ]


def test_inject_named_device(gpu_node, node_spec, tmp_path, capsys):
    """--device nvidia.com/gpu=0 injects GPU 0 by name (the same nodes as all on a 1-GPU node)."""
    bundle = bundles.make_bundle(tmp_path / "b", ["true"])
    assert (
        main(inject_argv(gpu_node, node_spec.source, bundle, "--device", "nvidia.com/gpu=0")) == 0
    )
    assert "device /dev/nvidia0 c" in capsys.readouterr().out


def test_inject_unknown_device_exits_1_naming_it(gpu_node, node_spec, tmp_path, capsys):
    """An unknown --device fails with exit 1, naming it and what exists; the bundle is untouched."""
    bundle = bundles.make_bundle(tmp_path / "b", ["true"])
    before = (bundle / "config.json").read_bytes()
    assert (
        main(inject_argv(gpu_node, node_spec.source, bundle, "--device", "nvidia.com/gpu=3")) == 1
    )
    err = capsys.readouterr().err
    assert "unknown CDI device nvidia.com/gpu=3" in err
    assert "nvidia.com/gpu offers: 0, GPU-" in err
    assert (bundle / "config.json").read_bytes() == before


def test_inject_device_from_a_cdi_dir(gpu_node, node_spec, tmp_path, capsys):
    """--cdi-dir adds specs (a DRA driver's) whose names --device can request."""
    claim = {
        "cdiVersion": "0.5.0",
        "kind": "k8s.gpu.nvidia.com/claim",
        "devices": [
            {"name": "c0ffee-gpu-0", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0"}]}}
        ],
        "containerEdits": {"deviceNodes": [{"path": "/dev/nvidiactl"}]},
    }
    (tmp_path / "cdi").mkdir()
    (tmp_path / "cdi" / "claim.json").write_text(json.dumps(claim))
    bundle = bundles.make_bundle(tmp_path / "b", ["true"])
    argv = inject_argv(
        gpu_node,
        node_spec.source,
        bundle,
        "--cdi-dir",
        str(tmp_path / "cdi"),
        "--device",
        "k8s.gpu.nvidia.com/claim=c0ffee-gpu-0",
    )
    assert main(argv) == 0
    devices = json.loads((bundle / "config.json").read_text())["linux"]["devices"]
    assert sorted(d["path"] for d in devices) == ["/dev/nvidia0", "/dev/nvidiactl"]


def test_generate_without_a_toolkit_points_at_the_toolkit_dir_flag(tmp_path, capsys):
    """--generate where no nvidia-ctk is: exit 1, saying where it looked and which flag to use."""
    bundle = bundles.make_bundle(tmp_path / "b", ["true"])
    code = main(
        [
            "inject",
            "--bundle",
            str(bundle),
            "--generate",
            "--cdi-output-dir",
            str(tmp_path / "cdi"),
            "--toolkit-dir",
            str(tmp_path / "no-toolkit"),
        ]
    )
    err = capsys.readouterr().err
    assert code == 1
    assert f"no nvidia-ctk in {tmp_path / 'no-toolkit'}" in err
    assert "--toolkit-dir" in err and "--cdi-spec" in err


def test_a_kept_hook_whose_binary_is_missing_is_warned_about(gpu_node, node_spec, tmp_path, capsys):
    """Hooks kept but no nvidia-cdi-hook at --toolkit-dir: injected, with a warning naming it."""
    bundle = bundles.make_bundle(tmp_path / "b", ["true"])
    elsewhere = tmp_path / "not-the-toolkit"
    assert (
        main(inject_argv(gpu_node, node_spec.source, bundle, "--toolkit-dir", str(elsewhere))) == 0
    )
    err = capsys.readouterr().err
    assert f"warning: {elsewhere / 'nvidia-cdi-hook'} does not exist" in err
    assert "--toolkit-dir" in err


def test_no_hook_warning_when_the_toolkit_has_the_hook(gpu_node, node_spec, tmp_path, capsys):
    """The mounted toolkit has nvidia-cdi-hook: nothing to warn about."""
    bundle = bundles.make_bundle(tmp_path / "b", ["true"])
    assert (
        main(
            inject_argv(
                gpu_node, node_spec.source, bundle, "--toolkit-dir", str(gpu_node.toolkit_dir)
            )
        )
        == 0
    )
    assert "warning" not in capsys.readouterr().err


def test_a_relative_toolkit_dir_writes_absolute_hook_paths(
    gpu_node, node_spec, tmp_path, capsys, monkeypatch
):
    """``--toolkit-dir toolkit`` (relative): every hook path in config.json is absolute (the
    runtime-spec requires it) and names the toolkit under the directory the command ran in."""
    bundle = bundles.make_bundle(tmp_path / "b", ["true"])
    monkeypatch.chdir(gpu_node.toolkit_dir.parent)
    relative = gpu_node.toolkit_dir.name
    assert main(inject_argv(gpu_node, node_spec.source, bundle, "--toolkit-dir", relative)) == 0
    assert "warning" not in capsys.readouterr().err  # the hook binary was found there
    hooks = json.loads((bundle / "config.json").read_text())["hooks"]["createContainer"]
    assert hooks
    for hook in hooks:
        assert Path(hook["path"]).is_absolute(), hook
        assert Path(hook["path"]).parent == gpu_node.toolkit_dir


def test_the_simulated_nodes_knob_is_in_the_help_and_the_docs(capsys):
    """NVIDIA_CTK_STANDIN_SYSTEM_ROOT (the stand-in's '/') is documented for --generate."""
    with pytest.raises(SystemExit):
        main(["inject", "--help"])
    assert _inject.STANDIN_SYSTEM_ROOT_ENV in capsys.readouterr().out.replace("\n", " ")
    guide = (Path(__file__).resolve().parents[2] / "docs" / "gpu-injection.md").read_text()
    assert f"{_inject.STANDIN_SYSTEM_ROOT_ENV}=$PWD/node" in guide  # run by tests/docs


@pytest.fixture(scope="module")
def four_gpu_node(tmp_path_factory):
    """A 4-GPU simulated node and its generated spec."""
    sim = node_.build_node(tmp_path_factory.mktemp("four") / "root", gpus=(0, 1, 2, 3))
    return sim, generate_spec(sim, tmp_path_factory.mktemp("four-cdi"))


def _gpu_paths(bundle: Path) -> list[str]:
    devices = json.loads((bundle / "config.json").read_text())["linux"]["devices"]
    return sorted(d["path"] for d in devices if d["path"][len("/dev/nvidia") :].isdigit())


@pytest.mark.parametrize(
    ("first", "again"),
    [
        # The subset case: GPU 3 must not stay granted behind an "already-injected".
        pytest.param(
            ["nvidia.com/gpu=1", "nvidia.com/gpu=3"], ["nvidia.com/gpu=1"], id="1+3-then-1"
        ),
        # An `all` bundle is not "already injected" with two of its GPUs.
        pytest.param([], ["nvidia.com/gpu=0", "nvidia.com/gpu=1"], id="all-then-0+1"),
    ],
)
def test_reinjecting_a_subset_is_refused(four_gpu_node, tmp_path, capsys, first, again):
    """A bundle holding more GPUs than the new request grants: exit 1 naming them, no write."""
    sim, spec = four_gpu_node
    bundle = bundles.make_bundle(tmp_path / "b", ["true"])
    devices = [arg for name in first for arg in ("--device", name)]
    assert main(inject_argv(sim, spec.source, bundle, *devices)) == 0
    held = _gpu_paths(bundle)
    before = (bundle / "config.json").read_bytes()
    capsys.readouterr()
    devices = [arg for name in again for arg in ("--device", name)]
    assert main(inject_argv(sim, spec.source, bundle, *devices)) == 1
    out, err = capsys.readouterr()
    assert "already-injected" not in out
    extra = sorted(set(held) - {f"/dev/nvidia{name[-1]}" for name in again})
    assert f"already holds {', '.join(extra)}, which this injection does not grant" in err
    assert len(err.strip().splitlines()) == 1
    assert (bundle / "config.json").read_bytes() == before


def test_reinjecting_the_same_gpus_is_already_injected(four_gpu_node, tmp_path, capsys):
    """The same two GPUs again: already-injected, nothing written."""
    sim, spec = four_gpu_node
    bundle = bundles.make_bundle(tmp_path / "b", ["true"])
    devices = ("--device", "nvidia.com/gpu=1", "--device", "nvidia.com/gpu=3")
    assert main(inject_argv(sim, spec.source, bundle, *devices)) == 0
    before = (bundle / "config.json").read_bytes()
    capsys.readouterr()
    assert main(inject_argv(sim, spec.source, bundle, *devices)) == 0
    assert capsys.readouterr().out.startswith(f"already-injected: {bundle}")
    assert (bundle / "config.json").read_bytes() == before


def test_inject_deeply_nested_config_exits_1_with_one_line(gpu_node, node_spec, tmp_path, capsys):
    """A config.json of 100,000 nested [ is one line on stderr and exit 1, no traceback."""
    (tmp_path / "config.json").write_bytes(b"[" * 100_000)
    assert main(inject_argv(gpu_node, node_spec.source, tmp_path)) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert f"{tmp_path}/config.json" in err
    assert "nested too deeply" in err


def test_a_spec_over_max_spec_bytes_exits_1_naming_the_limit(tmp_path, capsys):
    """--max-spec-bytes caps the spec file: over it, exit 1 with the file and the limit."""
    assert main(["cdi", "show", str(T4), "--max-spec-bytes", "1000"]) == 1
    err = capsys.readouterr().err
    assert str(T4) in err
    assert "larger than the limit of 1000 bytes" in err
    bundle = bundles.make_bundle(tmp_path / "b", ["true"])
    argv = ["inject", "--bundle", str(bundle), "--cdi-spec", str(T4), "--max-spec-bytes", "1000"]
    assert main(argv) == 1
    assert "larger than the limit of 1000 bytes" in capsys.readouterr().err


def test_cdi_show_warns_about_a_newer_cdi_version(tmp_path, capsys):
    """A spec of a cdiVersion newer than any known is shown, with a warning on stderr naming
    the fields it ignored."""
    spec = {
        "cdiVersion": "1.9.0",
        "kind": "nvidia.com/gpu",
        "devices": [
            {"name": "all", "containerEdits": {"deviceNodes": [{"path": "/dev/null"}]}},
        ],
        "containerEdits": {"futureEdit": True},
    }
    path = tmp_path / "new.json"
    path.write_text(json.dumps(spec))
    assert main(["cdi", "show", str(path)]) == 0
    captured = capsys.readouterr()
    assert "cdiVersion 1.9.0" in captured.out
    assert "cdiVersion 1.9.0 is newer than this parser knows" in captured.err
    assert "containerEdits.futureEdit" in captured.err


def test_a_typo_in_a_known_version_exits_1_with_the_field(tmp_path, capsys):
    """containerEdits.deviceNode (for deviceNodes) in a 0.5.0 spec: exit 1, field named."""
    spec = {
        "cdiVersion": "0.5.0",
        "kind": "nvidia.com/gpu",
        "devices": [{"name": "all", "containerEdits": {"deviceNodes": [{"path": "/dev/null"}]}}],
        "containerEdits": {"deviceNode": [{"path": "/dev/nvidiactl"}]},
    }
    path = tmp_path / "typo.json"
    path.write_text(json.dumps(spec))
    bundle = bundles.make_bundle(tmp_path / "b", ["true"])
    assert main(["inject", "--bundle", str(bundle), "--cdi-spec", str(path)]) == 1
    err = capsys.readouterr().err
    assert "containerEdits.deviceNode" in err
    assert "did you mean 'deviceNodes'?" in err
