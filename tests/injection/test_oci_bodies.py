"""The OCI config's typed dicts (substrate_gpu/injection/oci_bodies.py) hold to the real thing:
runc's own default config, and everything GPU injection writes."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from support.real import missing
from support.typeddicts import problems

from substrate_gpu import cdi
from substrate_gpu.injection import oci, oci_bodies
from substrate_gpu.injection.devices import ResolvedDevice
from substrate_gpu.testing import bundles

T4_SPEC = (
    Path(__file__).resolve().parents[1]
    / "data/cdi/real-world/kwx4957-study__ctk-1.20.0__drv-615.71.09__rocky9-T4.yaml"
)


@pytest.fixture(scope="module")
def runc_default_config(tmp_path_factory) -> dict[str, object]:
    """``runc spec``: the reference runtime's own config.json."""
    runc = shutil.which("runc")
    if runc is None:
        missing("runc")
    bundle = tmp_path_factory.mktemp("runc-spec")
    subprocess.run([runc, "spec", "--bundle", str(bundle)], check=True, capture_output=True)
    return json.loads((bundle / "config.json").read_text())


def test_runc_default_config_has_the_declared_types(runc_default_config):
    """Every field we declare has, in runc's own config, the type we declare."""
    assert problems(runc_default_config, oci_bodies.Config) == []


def test_the_checks_see_a_wrong_type():
    """A field of the wrong type is reported with its path (the check above can fail)."""
    config = bundles.runc_spec()
    config["root"] = {"path": 1}  # type: ignore[typeddict-item]
    assert problems(config, oci_bodies.Config) == ["$.root.path: expected str, got 1"]


def _injected(base: dict[str, object]) -> oci_bodies.Config:
    edits = cdi.edits_for_all(cdi.load_spec(T4_SPEC))
    devices = tuple(
        ResolvedDevice(n.path, n.host_path or n.path, "c", 195, i, "rwm", 0o666, uid=0, gid=0)
        for i, n in enumerate(edits.device_nodes)
    )
    plan = oci.plan_injection(
        edits,
        devices,
        driver_root="/usr/local/nvidia",
        hook_binary="/opt/nvidia-toolkit/nvidia-cdi-hook",
    )
    return oci.apply_plan(base, plan)  # type: ignore[arg-type]


@pytest.mark.parametrize("base", ["runc-default", "testing-kit"])
def test_what_injection_writes_is_declared_field_by_field(base, runc_default_config):
    """Injecting the real T4 spec writes only declared fields, each of its declared type."""
    config = _injected(runc_default_config if base == "runc-default" else bundles.runc_spec())  # type: ignore[arg-type]
    assert problems(config, oci_bodies.Config) == []
    linux = config["linux"]
    written = [
        *problems(linux["devices"], list[oci_bodies.LinuxDevice], "$.linux.devices", closed=True),
        *problems(
            linux["resources"]["devices"],
            list[oci_bodies.LinuxDeviceCgroup],
            "$.linux.resources.devices",
            closed=True,
        ),
        *problems(config["mounts"], list[oci_bodies.Mount], "$.mounts", closed=True),
        *problems(config["hooks"], oci_bodies.Hooks, "$.hooks", closed=True),
    ]
    assert written == []
    assert len(linux["devices"]) >= 4
    assert len(config["hooks"]["createContainer"]) >= 1
