"""Lifecycle benchmark: run as a script, prints every figure side by side in one run.

    .venv/bin/python tests/bench/bench_lifecycle.py [--actors 10000] [--idle 100000] [--smoke]

1. Events/s through the machine with N actors living whole lives (register → run → suspend
   refused → suspend → restore → delete), transitions' Machine against a plain dict
   transition table (the floor), both in the synchronous core (ActorTable.apply) and through
   the whole async Agent pipeline with instant in-process effects.
2. Memory per idle actor at 100,000 actors (tracemalloc; target ≤ 4 KiB).
3. Time to register 10,000 vs 100,000 actors (linear: the ratio should be about 10).
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
import tracemalloc
from pathlib import Path
from tempfile import TemporaryDirectory

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lifecycle.doubles import FakeInjector, FakeProbe, FakeRuntime, _Container

from substrate_gpu.lifecycle import Agent, actors, events, machine
from substrate_gpu.probes.api import GpuClient

SPEC = machine.load_spec()


class _MemoryRuntime(FakeRuntime):
    """The recording runtime without its disk writes: the benchmark measures the pipeline."""

    images: set[Path]

    async def checkpoint(
        self,
        container_id: str,
        image_path: Path,
        *,
        leave_running: bool,
        cuda_checkpoint_path: Path | None = None,
    ) -> None:
        await self._enter("checkpoint", ("runsc", "checkpoint", container_id))
        self.__dict__.setdefault("images", set()).add(image_path)
        self._stop(container_id)

    async def restore(
        self, container_id: str, bundle: Path, image_path: Path, *, nvproxy: bool
    ) -> None:
        await self._enter("restore", ("runsc", "restore", container_id))
        assert image_path in self.images
        self.containers[container_id] = self.containers.get(container_id) or _running(bundle)


def _running(bundle: Path) -> _Container:
    return _Container("running", 1, str(bundle), nvproxy=True)


class _NoClients:
    """A probe that finds no live CUDA client (the fd scan is benchmarked elsewhere)."""

    async def live_clients(self, pids: tuple[int, ...]) -> tuple[GpuClient, ...]:
        return ()


ENGINES = {"transitions": machine.TransitionsEngine, "dict table": machine.TableEngine}


def _life(actor_id: str) -> list[events.Event]:
    """Every event of one GPU actor's life, outcomes included (for the core benchmark)."""
    a = actor_id
    return [
        events.ActorRegistered(actor_id=a, gpu=True, bundle=f"/b/{a}"),
        events.BundlePrepared(actor_id=a, bundle=f"/b/{a}"),
        events.RunRequested(actor_id=a),
        events.GpuInjected(actor_id=a, devices=2),
        events.SandboxCreated(actor_id=a),
        events.SandboxStarted(actor_id=a),
        events.CudaContextOpened(actor_id=a),
        events.SuspendRequested(actor_id=a),  # refused: live context
        events.CudaContextClosed(actor_id=a),
        events.SuspendRequested(actor_id=a),
        events.CheckpointWritten(actor_id=a, image_path=f"/ck/{a}"),
        events.RestoreRequested(actor_id=a),
        events.Restored(actor_id=a, image_path=f"/ck/{a}", devices=2),
        events.DeleteRequested(actor_id=a),
        events.Deleted(actor_id=a),
    ]


def bench_core(n: int) -> dict[str, float]:
    """Events/s applying whole lives round-robin across ``n`` actors."""
    lives = [_life(f"actor-{i}") for i in range(n)]
    stream = [life[k] for k in range(len(lives[0])) for life in lives]
    out = {}
    for name, engine in ENGINES.items():
        table = actors.ActorTable(SPEC, engine(SPEC))
        gc.collect()
        start = time.perf_counter()
        for event in stream:
            table.apply(event)
        out[name] = len(stream) / (time.perf_counter() - start)
        assert table.state_counts()["deleted"] == n
    return out


async def _agent_lives(n: int, engine: str) -> float:
    runtime = _MemoryRuntime()
    with TemporaryDirectory() as tmp:
        async with Agent(
            runtime=runtime,
            probe=_NoClients(),
            injector=FakeInjector(),
            checkpoint_root=Path(tmp),
            engine=engine,  # type: ignore[arg-type]
            queue_size=4096,
            concurrency=256,
        ) as agent:
            start = time.perf_counter()
            ids = [f"actor-{i}" for i in range(n)]
            phases: list[list[events.Event]] = [
                [events.ActorRegistered(actor_id=a, gpu=True, bundle=f"/b/{a}") for a in ids],
                [events.BundlePrepared(actor_id=a, bundle=f"/b/{a}") for a in ids],
                [events.RunRequested(actor_id=a) for a in ids],
                [events.SuspendRequested(actor_id=a) for a in ids],
                [events.RestoreRequested(actor_id=a) for a in ids],
                [events.DeleteRequested(actor_id=a) for a in ids],
            ]
            for phase in phases:
                for event in phase:
                    await agent.submit(event)
                await agent.settle()
            elapsed = time.perf_counter() - start
            counts = agent.state_counts()
            assert counts["deleted"] == n, counts
    # Each life: 6 submitted events + the outcomes of inject, create, start, checkpoint,
    # restore and delete = 12 accepted events per actor.
    return 12 * n / elapsed


def bench_agent(n: int) -> dict[str, float]:
    """Events/s (submitted + effect outcomes) through the whole Agent."""
    return {name: anyio.run(_agent_lives, n, name) for name in ENGINES}


async def _register(n: int, *, measure_memory: bool) -> tuple[float, float]:
    runtime = FakeRuntime()
    with TemporaryDirectory() as tmp:
        async with Agent(
            runtime=runtime,
            probe=FakeProbe(runtime),
            injector=FakeInjector(),
            checkpoint_root=Path(tmp),
        ) as agent:
            gc.collect()
            if measure_memory:
                tracemalloc.start()
            before = tracemalloc.get_traced_memory()[0] if measure_memory else 0
            start = time.perf_counter()
            # The id and bundle strings are built inside the window: the actor keeps them.
            for i in range(n):
                actor_id = f"actor-{i:06d}"
                await agent.submit(
                    events.ActorRegistered(
                        actor_id=actor_id, gpu=True, bundle=f"/var/lib/substrate/bundles/{actor_id}"
                    )
                )
            elapsed = time.perf_counter() - start
            gc.collect()
            per_actor = 0.0
            if measure_memory:
                per_actor = (tracemalloc.get_traced_memory()[0] - before) / n
                tracemalloc.stop()
            assert agent.state_counts()["registered"] == n
    return elapsed, per_actor


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--actors", type=int, default=10_000)
    parser.add_argument("--idle", type=int, default=100_000)
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="tiny sizes, a few seconds, nothing judged (the test suite runs this)",
    )
    args = parser.parse_args()
    if args.smoke:
        args.actors, args.idle = 20, 200

    core = bench_core(args.actors)
    agent = bench_agent(args.actors)
    print(f"events/s with {args.actors:,} actors      transitions Machine   dict table (floor)")
    print(
        f"  synchronous core (apply)      {core['transitions']:>17,.0f}   {core['dict table']:>18,.0f}"
    )
    print(
        f"  whole Agent pipeline          {agent['transitions']:>17,.0f}   {agent['dict table']:>18,.0f}"
    )

    _, per_actor = anyio.run(lambda: _register(args.idle, measure_memory=True))
    print(f"memory per idle actor at {args.idle:,}: {per_actor:,.0f} bytes (target ≤ 4,096)")

    small, _ = anyio.run(lambda: _register(args.idle // 10, measure_memory=False))
    large, _ = anyio.run(lambda: _register(args.idle, measure_memory=False))
    print(
        f"register {args.idle // 10:,}: {small:.2f}s   register {args.idle:,}: {large:.2f}s   "
        f"ratio {large / small:.1f} (linear ≈ 10)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
