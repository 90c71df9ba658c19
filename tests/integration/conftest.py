"""Fixtures for whole-system tests: a simulated GPU node, the runsc stand-in over real runc,
the fd-scan CUDA probe and the real injector, all behind the lifecycle Agent."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from support import runc_bundle

from substrate_gpu.injection import bundle as bundle_
from substrate_gpu.injection import toolkit
from substrate_gpu.injection.injector import WorkerGpuInjector
from substrate_gpu.probes.fd_scan import FdScanProbe
from substrate_gpu.runsc import driver
from substrate_gpu.testing import node as node_

STANDIN_RUNSC = Path(__file__).resolve().parents[1] / "standins" / "runsc"


@dataclass
class World:
    """Everything an Agent needs, real where it can be."""

    node: node_.SimulatedNode
    runtime: driver.RunscDriver
    probe: FdScanProbe
    injector: WorkerGpuInjector
    checkpoints: Path
    argv_log: Path

    def runsc_commands(self) -> list[list[str]]:
        """Each stand-in invocation's argv (without the program name)."""
        if not self.argv_log.exists():
            return []
        return [json.loads(line)[1:] for line in self.argv_log.read_text().splitlines()]


@pytest.fixture(scope="module")
def openable_node(
    tmp_path_factory: pytest.TempPathFactory, require_root: None
) -> node_.SimulatedNode:
    """A 1-GPU node whose NVIDIA nodes can really be held open by a workload (1:3)."""
    return node_.build_node(
        tmp_path_factory.mktemp("node") / "root", gpus=(0,), openable_devices=True
    )


@pytest.fixture
def world(openable_node, runc_path, tmp_path, monkeypatch) -> Iterator[World]:
    """A fresh runsc root, argv log, checkpoint dir and injector per test."""
    argv_log = tmp_path / "runsc-argv.jsonl"
    monkeypatch.setenv("RUNSC_STANDIN_ARGV_LOG", str(argv_log))
    monkeypatch.setenv("RUNSC_STANDIN_RUNC", runc_path)
    monkeypatch.setenv("NVIDIA_CTK_STANDIN_SYSTEM_ROOT", str(openable_node.root))
    root = tmp_path / "runsc-root"
    root.mkdir()
    runtime = driver.RunscDriver(
        driver.RunscConfig(
            root=root,
            runsc=str(STANDIN_RUNSC),
            timeouts=driver.Timeouts(
                create=30, start=15, checkpoint=30, restore=30, state=10, delete=20
            ),
        )
    )
    config = toolkit.ToolkitConfig.from_env(
        {
            "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
            "NVIDIA_CTK_STANDIN_SYSTEM_ROOT": str(openable_node.root),
            toolkit.ENV_DRIVER_ROOT: str(openable_node.driver_root),
        },
        output_dir=tmp_path / "cdi",
        toolkit_dir=openable_node.toolkit_dir,
    )
    injector = WorkerGpuInjector(
        generator=toolkit.CdiSpecGenerator(config),
        options=bundle_.InjectionOptions(
            driver_root=str(openable_node.driver_root),
            dev_root=openable_node.root,
            toolkit_dir=openable_node.toolkit_dir,
        ),
    )
    yield World(
        node=openable_node,
        runtime=runtime,
        probe=FdScanProbe(),
        injector=injector,
        checkpoints=tmp_path / "checkpoints",
        argv_log=argv_log,
    )
    runc_bundle.delete_all(root, runc=runc_path)
