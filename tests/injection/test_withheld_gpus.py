"""A sandbox's app container given no GPU while its siblings name theirs (GPUs per
container, issue 31 §10): nothing of the GPU is added, the image's NVIDIA_VISIBLE_DEVICES is
dropped, and a config that holds an NVIDIA node already is refused, untouched."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest

from substrate_gpu import exceptions
from substrate_gpu.cdi import model
from substrate_gpu.injection import bundle as bundle_
from substrate_gpu.injection import oci
from substrate_gpu.injection.injector import WorkerGpuInjector


def _config(env: list[str], devices: list[dict[str, object]] | None = None) -> oci.OciConfig:
    config: dict[str, object] = {
        "process": {"args": ["sh"], "env": env},
        "root": {"path": "rootfs"},
    }
    if devices is not None:
        config["linux"] = {"devices": devices}
    return config  # type: ignore[return-value]


@pytest.mark.parametrize(
    ("env", "kept"),
    [
        pytest.param(
            ["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=compute"],
            ["PATH=/bin", "NVIDIA_DRIVER_CAPABILITIES=compute"],
            id="cuda-image-env",
        ),
        pytest.param(
            ["NVIDIA_VISIBLE_DEVICES=0", "A=1", "NVIDIA_VISIBLE_DEVICES=1"], ["A=1"], id="twice"
        ),
    ],
)
def test_the_images_visible_devices_is_dropped_and_nothing_added(
    env: list[str], kept: list[str]
) -> None:
    """Only NVIDIA_VISIBLE_DEVICES goes (runsc reads it with the toolkit's hook)."""
    withheld = oci.withheld(_config(env))
    assert withheld is not None
    assert withheld["process"]["env"] == kept
    assert set(withheld) == {"process", "root"}


def test_a_config_without_it_is_left_alone() -> None:
    assert oci.withheld(_config(["PATH=/bin"])) is None


def test_a_config_holding_an_nvidia_node_is_refused() -> None:
    """Removing a node is not ours to decide: the bundle must be re-created."""
    config = _config([], [{"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0}])
    with pytest.raises(exceptions.InjectionError, match=r"holds /dev/nvidia0.*given no GPU"):
        oci.withheld(config, where="side/config.json")


def _bundle(directory: Path, config: oci.OciConfig) -> Path:
    (directory / "side").mkdir(parents=True)
    (directory / "side" / "config.json").write_text(json.dumps(config))
    return directory


def test_the_injector_withholds_through_the_bundle_atomically(tmp_path: Path) -> None:
    """``devices=()`` for a container: withheld, 0 device nodes, the file rewritten."""
    bundle = _bundle(tmp_path, _config(["NVIDIA_VISIBLE_DEVICES=all", "A=1"]))
    injector = WorkerGpuInjector(
        spec=model.Spec(cdi_version="0.6.0", kind="nvidia.com/gpu", devices=()),
        options=bundle_.InjectionOptions(),
    )
    assert anyio.run(lambda: injector(bundle, devices=(), container="side")) == 0
    assert injector.last_report is not None and injector.last_report.outcome == "withheld"
    written = json.loads((bundle / "side" / "config.json").read_text())
    assert written["process"]["env"] == ["A=1"]


def test_a_refused_withhold_leaves_the_config_byte_identical(tmp_path: Path) -> None:
    config = _config([], [{"path": "/dev/nvidia1", "type": "c", "major": 195, "minor": 1}])
    bundle = _bundle(tmp_path, config)
    before = (bundle / "side" / "config.json").read_bytes()
    with pytest.raises(exceptions.InjectionError, match="holds /dev/nvidia1"):
        bundle_.withhold_gpus(bundle, "side")
    assert (bundle / "side" / "config.json").read_bytes() == before
