"""runsc benchmark: a CPU actor on real gVisor, through the Agent vs the same runsc commands
issued directly on the same bundle, side by side in one run.

    .venv/bin/python tests/bench/bench_runsc.py [--rounds 10] [--smoke]

Needs the runsc scripts/build-runsc.sh builds (``--platform=systrap --network=none``, as the
tests run it) and root. Per operation, the median over the rounds:

- **create→running**: Agent ``run_requested`` until ``running`` (its create + start effects)
  vs ``runsc create`` + ``runsc start``;
- **checkpoint**: Agent ``suspend_requested`` until ``suspended`` (checkpoint
  ``--leave-running``, the manifest, ``delete --force``) vs those two runsc commands;
- **restore**: Agent ``restore_requested`` until ``running`` (manifest check, ``restore
  --detach``) vs ``runsc restore --detach``.

Target: the agent adds ≤ 10 % and ≤ 20 ms per operation. Upstream reports, for a CPU actor,
restore 196–294 ms and checkpoint 212–243 ms. Rounds alternate agent and direct so machine
noise hits both alike. Each target is printed met or MISSED, and a miss exits 1
(tests/bench/_targets.py). ``--smoke``: one round, no verdicts.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import _targets
from support import real_runsc, runc_bundle

from substrate_gpu.lifecycle import Agent, events
from substrate_gpu.probes.fd_scan import FdScanProbe
from substrate_gpu.runsc import driver

OPS = ("create→running", "checkpoint", "restore")


async def _no_gpu(bundle: Path) -> int:
    raise AssertionError(f"CPU actor {bundle} injected")


def _runsc(runsc: Path, root: Path, *args: str) -> None:
    # No pipes: a sandbox started by create/restore inherits runsc's stdio and keeps it open.
    subprocess.run(
        [str(runsc), "--root", str(root), *real_runsc.GLOBAL_FLAGS, *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        check=True,
        timeout=120,
    )


def direct_round(runsc: Path, root: Path, bundle: Path, images: Path, cid: str) -> list[float]:
    """The runsc commands the agent issues, straight from here."""
    image = images / cid
    t0 = time.perf_counter()
    _runsc(
        runsc,
        root,
        "create",
        "--bundle",
        str(bundle),
        "--pid-file",
        str(images / f"{cid}.pid"),
        cid,
    )
    _runsc(runsc, root, "start", cid)
    t1 = time.perf_counter()
    _runsc(runsc, root, "checkpoint", "--image-path", str(image), "--leave-running", cid)
    _runsc(runsc, root, "delete", "--force", cid)
    t2 = time.perf_counter()
    _runsc(
        runsc, root, "restore", "--bundle", str(bundle), "--image-path", str(image), "--detach", cid
    )
    t3 = time.perf_counter()
    _runsc(runsc, root, "delete", "--force", cid)
    return [t1 - t0, t2 - t1, t3 - t2]


async def agent_round(agent: Agent, bundle: Path, cid: str) -> list[float]:
    """The same life through the Agent (events in, states awaited)."""
    await agent.submit(events.ActorRegistered(actor_id=cid, gpu=False, bundle=str(bundle)))
    await agent.submit(events.BundlePrepared(actor_id=cid, bundle=str(bundle)))
    t0 = time.perf_counter()
    await agent.submit(events.RunRequested(actor_id=cid))
    await agent.wait_for_state(cid, "running", timeout=60)
    t1 = time.perf_counter()
    await agent.submit(events.SuspendRequested(actor_id=cid))
    await agent.wait_for_state(cid, "suspended", timeout=60)
    t2 = time.perf_counter()
    await agent.submit(events.RestoreRequested(actor_id=cid))
    await agent.wait_for_state(cid, "running", timeout=60)
    t3 = time.perf_counter()
    await agent.submit(events.DeleteRequested(actor_id=cid))
    await agent.wait_for_state(cid, "deleted", timeout=60)
    return [t1 - t0, t2 - t1, t3 - t2]


async def main_async(rounds: int, smoke: bool) -> int:
    runsc = real_runsc.find()
    if runsc is None:
        print(
            f"no runsc at {real_runsc.cached_binary()}: run scripts/build-runsc.sh",
            file=sys.stderr,
        )
        # A smoke run on a machine without it is a skip, except where real is required (CI).
        required = os.environ.get("SUBSTRATE_GPU_REQUIRE_REAL") == "1"
        return 1 if (required or not smoke) else 0
    with tempfile.TemporaryDirectory(prefix="bench-runsc-") as tmp:
        base = Path(tmp)
        bundle = runc_bundle.make_busybox_bundle(base / "bundle", ["/bin/sleep", "100000"])
        root = base / "root"
        images = base / "direct-images"
        images.mkdir()
        runtime = driver.RunscDriver(
            driver.RunscConfig(root=root, runsc=str(runsc), global_flags=real_runsc.GLOBAL_FLAGS)
        )
        await runtime.features()  # detected once per agent: not part of any operation
        agent_times: list[list[float]] = []
        direct_times: list[list[float]] = []
        try:
            async with Agent(
                runtime=runtime,
                probe=FdScanProbe(),
                injector=_no_gpu,
                checkpoint_root=base / "agent-images",
            ) as agent:
                for i in range(rounds):
                    agent_times.append(await agent_round(agent, bundle, f"agent-{i}"))
                    direct_times.append(
                        await anyio.to_thread.run_sync(
                            direct_round, runsc, root, bundle, images, f"direct-{i}"
                        )
                    )
        finally:
            real_runsc.delete_all(runsc, root)
    print(f"runsc benchmark: {runsc} ({(await runtime.features()).version}), {rounds} round(s),")
    print("CPU actor (busybox sleep), --platform=systrap --network=none; median per operation\n")
    targets = _targets.Targets(smoke=smoke)
    report(agent_times, direct_times, targets)
    print("\nupstream (agent-substrate, CPU actor): restore 196–294 ms, checkpoint 212–243 ms")
    return targets.exit_status()


def report(
    agent_times: list[list[float]], direct_times: list[list[float]], targets: _targets.Targets
) -> None:
    """The table: per operation, the medians and the overhead, judged against both bounds
    (the agent adds at most 10 % *and* at most 20 ms)."""
    print(f"{'operation':<16}{'agent ms':>10}{'direct ms':>11}{'overhead':>11}{'%':>8}  targets")
    for k, op in enumerate(OPS):
        a = statistics.median(t[k] for t in agent_times) * 1000
        d = statistics.median(t[k] for t in direct_times) * 1000
        over, pct = a - d, (a - d) / d * 100
        relative = targets.judge(f"{op} ≤ 10 %", pct <= 10)
        absolute = targets.judge(f"{op} ≤ 20 ms", over <= 20)
        print(f"{op:<16}{a:>10.1f}{d:>11.1f}{over:>+10.1f} {pct:>+7.1f}  {relative}, {absolute}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--smoke", action="store_true", help="one round, no verdicts")
    args = parser.parse_args()
    return anyio.run(main_async, 1 if args.smoke else args.rounds, args.smoke)


if __name__ == "__main__":
    sys.exit(main())
