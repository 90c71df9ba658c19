"""The standalone agent's GPU settings: driver preflight and suspend routes from its flags."""

from __future__ import annotations

from pathlib import Path

from substrate_gpu.cli import _agent, build_parser
from substrate_gpu.runsc import driver
from substrate_gpu.service import wiring


def config_for(*flags: str):
    args = build_parser().parse_args(["agent", "--stdin", *flags])
    return _agent.config_from(args)


def runsc_driver(tmp_path: Path) -> driver.RunscDriver:
    return driver.RunscDriver(driver.RunscConfig(root=tmp_path))


def test_preflight_is_on_and_routes_off_by_default(tmp_path):
    """By default the driver is checked before create/restore and no CUDA route is offered."""
    settings = wiring.gpu_settings(config_for(), runsc_driver(tmp_path))
    assert settings is not None
    assert settings.driver_preflight
    assert settings.cuda_checkpoint_path is None
    assert settings.sandbox_tool is None


def test_flags_enable_the_suspend_routes(tmp_path):
    """--cuda-checkpoint and --sandbox-cuda-checkpoint turn on the two routes."""
    config = config_for(
        "--cuda-checkpoint",
        "/usr/bin/cuda-checkpoint",
        "--sandbox-cuda-checkpoint",
        "/opt/tools/cuda-checkpoint",
        "--no-driver-preflight",
    )
    settings = wiring.gpu_settings(config, runsc_driver(tmp_path))
    assert settings is not None
    assert settings.cuda_checkpoint_path == Path("/usr/bin/cuda-checkpoint")
    assert settings.sandbox_tool is not None
    assert not settings.driver_preflight


def test_no_gpu_settings_without_the_runsc_driver():
    """The demo's in-process runtime model cannot answer runsc's questions: no settings."""
    assert wiring.gpu_settings(config_for(), object()) is None
