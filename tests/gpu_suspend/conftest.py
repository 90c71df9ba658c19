"""A GPU node for suspend scenarios: the Agent over the runsc stand-in (real runc), the fd-scan
probe, the cuda-checkpoint stand-in (on the host for runsc's route, inside the container for
the exec route), driver facts in files the test controls, and an event log per scenario.

The node is files: ``<node>/proc-version`` (what ``/proc/driver/nvidia/version`` says),
``<node>/driver/lib64/libcuda.so.<v>``, ``<node>/dev/nvidia0``. runsc's supported drivers
come from ``RUNSC_STANDIN_DRIVERS``; the stand-in itself refuses ``--nvproxy`` for an
unlisted ``RUNSC_STANDIN_HOST_DRIVER``, as gVisor would.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from cudackpt.sandbox import CUDA_CHECKPOINT, RUNSC, STANDINS, STATE_IN_CONTAINER, TOOL_IN_CONTAINER
from support import runc_bundle

from substrate_gpu.lifecycle import Agent
from substrate_gpu.lifecycle.gpu import GpuSettings, exec_tool
from substrate_gpu.probes.fd_scan import FdScanProbe
from substrate_gpu.runsc import driver

#: The node's driver: listed by the runsc stand-in below.
DRIVER = "570.133.20"
SUPPORTED = f"535.183.01,550.90.07,{DRIVER}"

# A CUDA "process" as pid 1: holds /dev/nvidia0 (and /dev/zero, which only a test that
# widens runsc's device pattern counts as a client); SIGUSR1 drops the GPU (its CUDA state
# went to host memory), SIGUSR2 takes it again. Python, not sh: it never forks, so no
# short-lived child ever inherits the GPU handle for a scanner to catch.
WORKER = """\
import os, signal
held = []
def hold(*_):
    if not held:
        held.append(os.open("/dev/nvidia0", os.O_RDONLY))
def drop(*_):
    while held:
        os.close(held.pop())
signal.signal(signal.SIGUSR1, drop)
signal.signal(signal.SIGUSR2, hold)
hold()
zero = os.open("/dev/zero", os.O_RDONLY)
while True:
    signal.pause()
"""


def proc_version_text(version: str) -> str:
    """``/proc/driver/nvidia/version`` of the open kernel module ``version``."""
    return (
        f"NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {version}  "
        "Release Build  (dvs-builder@U16-I3-B13-2-1)  Thu Mar 13 2025\n"
        "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n"
    )


class BundleGpus:
    """The injector of these scenarios: the bundle is built holding its GPU node, so this
    reports it (injection itself is tested in tests/injection and tests/integration)."""

    async def __call__(
        self, bundle: Path, *, devices: Sequence[str] | None = None, container: str | None = None
    ) -> int:
        config = json.loads((bundle / (container or "") / "config.json").read_text())
        nodes = config.get("linux", {}).get("devices", [])
        return sum(1 for d in nodes if str(d.get("path", "")).startswith("/dev/nvidia"))


@dataclass
class World:
    """One scenario's node, runtime and logs."""

    tmp: Path
    node: Path
    runtime: driver.RunscDriver
    argv_log: Path
    host_tool_state: Path
    event_log: Path
    runc: str
    monkeypatch: pytest.MonkeyPatch
    bundles: list[Path] = field(default_factory=list)

    def set_driver(self, version: str) -> None:
        """The node's driver is ``version``: kernel module, libcuda, and what runsc sees."""
        (self.node / "proc-version").write_text(proc_version_text(version))
        lib64 = self.node / "driver" / "lib64"
        for old in lib64.glob("libcuda.so.*"):
            old.unlink()
        (lib64 / f"libcuda.so.{version}").touch()
        self.monkeypatch.setenv("RUNSC_STANDIN_HOST_DRIVER", version)

    def set_features(self, *features: str) -> None:
        """Which runsc features exist (a fresh driver re-detects them)."""
        self.monkeypatch.setenv("RUNSC_STANDIN_FEATURES", ",".join(features))
        self.runtime = _runtime(self.tmp / "runsc-root")

    def gpu_settings(self, **overrides: Any) -> GpuSettings:
        """Settings on this node; both tools configured unless overridden."""
        kwargs: dict[str, Any] = {
            "drivers": self.runtime,
            "driver_root": self.node / "driver",
            "proc_version": self.node / "proc-version",
            "dev_root": self.node,
            "cuda_checkpoint_path": CUDA_CHECKPOINT,
            "sandbox_tool": exec_tool(self.runtime, TOOL_IN_CONTAINER),
            "lock_timeout_ms": 300,
        }
        kwargs.update(overrides)
        return GpuSettings(**kwargs)

    def agent(self, recorder: Any, metrics: Any, **gpu: Any) -> Agent:
        """An Agent on this node recording into ``recorder``; ``metrics`` also observes."""
        return Agent(
            runtime=self.runtime,
            probe=FdScanProbe(),
            injector=BundleGpus(),
            checkpoint_root=self.tmp / "checkpoints",
            recorder=recorder,
            metrics=metrics,
            observers=[metrics],
            gpu=self.gpu_settings(**gpu),
            timeouts={"probe": 30, "cuda_suspend": 30, "cuda_resume": 30},
        )

    def bundle(
        self, name: str, *, tool_inside: bool = True, knobs: dict[str, str] | None = None
    ) -> tuple[Path, Path]:
        """A bundle running :data:`WORKER` as pid 1 with ``/dev/nvidia0`` (1:3) and the
        host's ``/usr`` read-only (for Python); with ``tool_inside`` the cuda-checkpoint
        stand-in is in it too (``tests/standins`` at ``/opt/standins``). Returns (bundle,
        the tool's state directory)."""
        state = self.tmp / f"{name}-tool-state"
        state.mkdir()
        env = [
            f"CUDA_CHECKPOINT_STANDIN_STATE={STATE_IN_CONTAINER}",
            "CUDA_CHECKPOINT_STANDIN_RELEASE_SIGNAL=USR1",
            "CUDA_CHECKPOINT_STANDIN_REACQUIRE_SIGNAL=USR2",
            *(f"{k}={v}" for k, v in (knobs or {}).items()),
        ]
        bundle = runc_bundle.make_busybox_bundle(
            self.tmp / name,
            ["/usr/bin/python3", "/gpu-worker.py"],
            env=env,
            devices=[runc_bundle.DeviceNode("/dev/nvidia0")],
            binds=[(state, STATE_IN_CONTAINER)],
            runc=self.runc,
        )
        rootfs = bundle / "rootfs"
        (rootfs / "gpu-worker.py").write_text(WORKER)
        config_path = bundle / "config.json"
        config = json.loads(config_path.read_text())
        binds = [("/usr", "/usr"), *([(str(STANDINS), "/opt/standins")] if tool_inside else [])]
        for link in ("lib", "lib64"):
            host = Path("/") / link
            if host.is_symlink():
                (rootfs / link).symlink_to(os.readlink(host))
            elif host.is_dir():
                binds.append((str(host), f"/{link}"))
        for source, dest in binds:
            (rootfs / dest.lstrip("/")).mkdir(parents=True, exist_ok=True)
            config["mounts"].append(
                {
                    "destination": dest,
                    "type": "bind",
                    "source": source,
                    "options": ["rbind", "ro", "nosuid"],
                }
            )
        config_path.write_text(json.dumps(config, indent=2))
        self.bundles.append(bundle)
        return bundle, state

    def runsc_commands(self) -> list[list[str]]:
        """Each stand-in invocation's argv (without the program name)."""
        if not self.argv_log.exists():
            return []
        return [json.loads(line)[1:] for line in self.argv_log.read_text().splitlines()]

    def checkpoint_commands(self) -> list[list[str]]:
        """The ``runsc checkpoint`` invocations (feature probes and execs left out)."""
        return [
            c
            for c in self.runsc_commands()
            if "checkpoint" in c and "help" not in c and "exec" not in c
        ]


def _runtime(root: Path) -> driver.RunscDriver:
    return driver.RunscDriver(
        driver.RunscConfig(
            root=root,
            runsc=str(RUNSC),
            timeouts=driver.Timeouts(
                create=20, start=10, checkpoint=30, restore=20, state=10, delete=20, exec=20
            ),
        )
    )


@pytest.fixture
def world(tmp_path: Path, runc_path: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    """A fresh node (driver :data:`DRIVER`, one GPU), runsc root and logs per scenario."""
    node = tmp_path / "node"
    (node / "driver" / "lib64").mkdir(parents=True)
    (node / "dev").mkdir()
    (node / "dev" / "nvidia0").touch()
    argv_log = tmp_path / "runsc-argv.jsonl"
    host_tool_state = tmp_path / "host-tool-state"
    host_tool_state.mkdir()
    for name in [k for k in os.environ if k.startswith(("RUNSC_STANDIN_", "CUDA_CHECKPOINT_"))]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("RUNSC_STANDIN_ARGV_LOG", str(argv_log))
    monkeypatch.setenv("RUNSC_STANDIN_RUNC", runc_path)
    monkeypatch.setenv("RUNSC_STANDIN_DRIVERS", SUPPORTED)
    # The host-side tool (runsc's --cuda-checkpoint-path route) inherits runsc's environment.
    monkeypatch.setenv("CUDA_CHECKPOINT_STANDIN_STATE", str(host_tool_state))
    monkeypatch.setenv("CUDA_CHECKPOINT_STANDIN_RELEASE_SIGNAL", "USR1")
    monkeypatch.setenv("CUDA_CHECKPOINT_STANDIN_REACQUIRE_SIGNAL", "USR2")
    root = tmp_path / "runsc-root"
    root.mkdir()
    w = World(
        tmp=tmp_path,
        node=node,
        runtime=_runtime(root),
        argv_log=argv_log,
        host_tool_state=host_tool_state,
        event_log=tmp_path / "log" / "events.jsonl",
        runc=runc_path,
        monkeypatch=monkeypatch,
    )
    w.set_driver(DRIVER)
    yield w
    runc_bundle.delete_all(root, runc=runc_path)
