"""``substrate-gpu demo``: a simulated GPU node, end to end, in a temporary directory.

The node has real char device nodes (when root), real ELF driver libraries and the
toolkit stand-ins (:mod:`substrate_gpu.simulation`). The demo generates the worker's CDI
spec through the production generation path, injects it into actor bundles, shows that a
second injection is a no-op, and — with root and runc — runs each actor in a real runc
container and prints what the actor sees. It says which runtime it used.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import anyio

from substrate_gpu import cdi
from substrate_gpu.injection import bundle as bundle_
from substrate_gpu.injection import toolkit
from substrate_gpu.rootfs import SonameCache
from substrate_gpu.simulation import bundles
from substrate_gpu.simulation import node as node_

ACTOR_VIEW = r"""
echo "  devices: $(ls /dev | grep nvidia | tr '\n' ' ')"
( : < /dev/nvidia0 ) 2>&1 | sed 's/^/  open \/dev\/nvidia0: /'
echo "  LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
echo "  NVIDIA_VISIBLE_DEVICES=${NVIDIA_VISIBLE_DEVICES:-(unset)}"
echo "  $LIBDIR/libcuda.so.1 -> $(readlink $LIBDIR/libcuda.so.1)"
"""


@dataclass(frozen=True)
class DemoResult:
    """What the demo did, for tests and the summary."""

    workdir: Path
    """Where the simulated node and bundles live."""
    runtime: str
    """``runc`` or ``none`` (why is printed)."""
    injected: int
    """Bundles injected."""


def _runc_usable() -> tuple[str | None, str]:
    runc = shutil.which("runc")
    if runc is None:
        return None, "runc is not installed"
    if os.geteuid() != 0:
        return None, "not running as root"
    return runc, "runc " + subprocess.run(
        [runc, "--version"], capture_output=True, text=True, check=False
    ).stdout.split("\n", 1)[0].removeprefix("runc version ")


def run_demo(workdir: Path, out: TextIO, *, actors: int = 2) -> DemoResult:
    """Run the demo under ``workdir``; progress goes to ``out``."""
    print(f"simulated GPU node in {workdir}", file=out)
    sim = node_.build_node(workdir / "node", gpus=(0, 1))
    kind = "mknod char devices" if sim.real_device_nodes else "links to /dev/null (not root)"
    print(f"  GPUs {sim.gpus}, driver {sim.driver_version}, device nodes: {kind}", file=out)
    env = {
        **os.environ,
        "NVIDIA_CTK_STANDIN_SYSTEM_ROOT": str(sim.root),
        toolkit.ENV_DRIVER_ROOT: str(sim.driver_root),
    }
    config = toolkit.ToolkitConfig.from_env(
        env, output_dir=workdir / "cdi", toolkit_dir=sim.toolkit_dir, timeout=60
    )
    spec = anyio.run(toolkit.CdiSpecGenerator(config).ensure_spec)
    edits = cdi.edits_for_all(spec)
    print(
        f"generated {config.spec_path} with nvidia-ctk (stand-in): "
        f"{len(spec.devices)} devices, {len(edits.mounts)} mounts",
        file=out,
    )
    runc, runtime = _runc_usable()
    print(f"runtime: {runtime if runc else 'none (' + runtime + ')'}", file=out)
    cache = SonameCache()
    options = bundle_.InjectionOptions(
        driver_root=str(sim.driver_root), dev_root=sim.root, toolkit_dir=sim.toolkit_dir
    )
    for index in range(actors):
        name = f"actor-{index}"
        bundle = bundles.make_bundle(
            workdir / "bundles" / name,
            ["sh", "-c", ACTOR_VIEW],
            env=[
                "PATH=/bin",
                "NVIDIA_VISIBLE_DEVICES=all",
                "LD_LIBRARY_PATH=/opt/app/lib",
                f"LIBDIR={sim.lib64}",
            ],
        )
        report = bundle_.inject_gpu(bundle, edits, options=options, soname_cache=cache)
        links = report.links
        print(
            f"{name}: {report.outcome} in {report.seconds * 1000:.2f} ms — "
            f"{len(report.devices)} devices, {report.mounts} mounts, "
            f"hooks kept {list(report.hooks_kept)}, skipped {list(report.hooks_skipped)}, "
            f"{len(links.created) if links else 0} SONAME links",
            file=out,
        )
        again = bundle_.inject_gpu(bundle, edits, options=options, soname_cache=cache)
        print(f"{name}: second injection: {again.outcome}", file=out)
        if runc:
            container_id = f"substrate-gpu-demo-{uuid.uuid4().hex[:8]}"
            state_root = workdir / "runc-state"
            result = subprocess.run(
                [runc, "--root", str(state_root), "run", "--bundle", str(bundle), container_id],
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            subprocess.run(
                [runc, "--root", str(state_root), "delete", "--force", container_id],
                capture_output=True,
                check=False,
            )
            print(f"{name}: inside runc container {container_id}:", file=out)
            out.write(result.stdout)
            if result.returncode != 0:
                print(f"  runc failed ({result.returncode}): {result.stderr.strip()}", file=out)
    return DemoResult(workdir=workdir, runtime="runc" if runc else "none", injected=actors)


def main(workdir: Path | None, out: TextIO) -> DemoResult:
    """Run in ``workdir`` (kept) or a temporary directory (removed afterwards)."""
    if workdir is not None:
        workdir.mkdir(parents=True, exist_ok=True)
        return run_demo(workdir, out)
    with tempfile.TemporaryDirectory(prefix="substrate-gpu-demo-") as tmp:
        return run_demo(Path(tmp), out)
