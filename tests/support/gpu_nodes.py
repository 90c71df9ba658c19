"""Generating CDI specs for simulated GPU nodes through the real generation path."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import anyio

from substrate_gpu.injection import bundle as bundle_
from substrate_gpu.injection import toolkit

if TYPE_CHECKING:
    from pathlib import Path

    from substrate_gpu.cdi import model
    from substrate_gpu.testing import node as node_


def toolkit_config(
    sim: node_.SimulatedNode,
    output_dir: Path,
    *,
    toolkit_version: str = "1.20.0",
    timeout: float = 30,
) -> toolkit.ToolkitConfig:
    """A ToolkitConfig pointing at the node's toolkit stand-in and driver root."""
    env = {
        **os.environ,
        "NVIDIA_CTK_STANDIN_SYSTEM_ROOT": str(sim.root),
        "NVIDIA_CTK_STANDIN_VERSION": toolkit_version,
        toolkit.ENV_DRIVER_ROOT: str(sim.driver_root),
    }
    return toolkit.ToolkitConfig.from_env(
        env, output_dir=output_dir, toolkit_dir=sim.toolkit_dir, timeout=timeout
    )


def generate_spec(
    sim: node_.SimulatedNode, output_dir: Path, *, toolkit_version: str = "1.20.0"
) -> model.Spec:
    """Run CdiSpecGenerator against the node's toolkit stand-in."""
    config = toolkit_config(sim, output_dir, toolkit_version=toolkit_version)
    return anyio.run(toolkit.CdiSpecGenerator(config).ensure_spec)


def injection_options(sim: node_.SimulatedNode) -> bundle_.InjectionOptions:
    """Where the node's driver, device nodes and toolkit are, as an injection needs them."""
    return bundle_.InjectionOptions(
        driver_root=str(sim.driver_root), dev_root=sim.root, toolkit_dir=sim.toolkit_dir
    )
