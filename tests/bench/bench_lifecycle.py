"""Lifecycle benchmark: run as a script, prints every figure side by side in one run.

    .venv/bin/python tests/bench/bench_lifecycle.py [--actors 10000] [--idle 100000] [--smoke]

1. Events/s through the machine with N actors living the machine's real lives, round-robin:
   GPU actors run, are probed on suspend, suspend a live CUDA context through the exec
   route, restore and resume it, suspend again with no context, and are deleted; CPU
   actors run, have a suspend refused for a live context, suspend, restore and are deleted.
   The core (``ActorTable.apply`` over the :class:`Interpreter`, what the agent,
   replay and recovery run) is printed next to the same table over a plain dict-table
   floor (names looked up per event, no compilation) and over transitions' ``Machine`` (the
   reference); target: core ≥ 0.5× floor.
2. The whole async Agent pipeline (instant in-process effects, GPU actors: run → suspend
   with a probe → restore → delete) over the interpreter, next to the same pipeline over
   the floor. Events are counted as the agent accepts them, never assumed.
3. Memory per idle actor at 100,000 actors (tracemalloc; target ≤ 4 KiB), and the time to
   register 10,000 vs 100,000 actors (linear: target ratio ≤ 11).

``--smoke``: tiny sizes, seconds, no target checked (the suite runs it so it keeps working).
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

import _targets
from lifecycle.doubles import FakeInjector, FakeProbe, FakeRuntime, _Container

from substrate_gpu.lifecycle import Agent, actors, events, hooks, machine, table
from substrate_gpu.probes.api import GpuClient
from substrate_gpu.testing import lives

SPEC = machine.load_spec()
_TMPFS = Path("/dev/shm")


class _MemoryRuntime(FakeRuntime):
    """The recording runtime that writes no checkpoint image: the benchmark measures the
    pipeline. It still makes the image directory, as runsc does, so the agent's manifest
    write (part of the pipeline) lands beside it instead of failing with a warning."""

    images: set[Path]

    async def checkpoint(
        self,
        container_id: str,
        image_path: Path,
        *,
        leave_running: bool,
        cuda_checkpoint_path: Path | None = None,
        cuda_checkpoint_sequential: bool = False,
    ) -> None:
        await self._enter("checkpoint", ("runsc", "checkpoint", container_id))
        image_path.mkdir(parents=True, exist_ok=True)
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


class PlainTableEngine:
    """The floor: a plain ``{(state, trigger): transitions}`` dict of the spec, condition and
    callback *names* looked up on the actor per event (no compiled functions)."""

    def __init__(self, spec: machine.MachineSpec) -> None:
        self._table = {
            (source, trigger): [(t.conditions, t.unless, t.dest, t.after) for t in candidates]
            for (source, trigger), candidates in spec._by_source_trigger.items()
        }
        self.moves = table.moves_from_fire(spec, self.fire)

    def fire(self, actor: actors.Actor, event: events.Event) -> bool:
        for conditions, unless, dest, after in self._table[(actor.state, event.type)]:
            if all(getattr(actor, c)(event) for c in conditions) and not any(
                getattr(actor, u)(event) for u in unless
            ):
                if dest is not None:
                    actor.state = dest
                for callback in after:
                    getattr(actor, callback)(event)
                return True
        return False


ENGINES: dict[str, type[table.Engine]] = {
    "interpreter": machine.Interpreter,
    "dict-table floor": PlainTableEngine,
    "transitions Machine": machine.TransitionsEngine,
}


def _gpu_life(a: str) -> list[events.Event]:
    """A GPU actor: probed suspends, the exec route for a live context, resumed on restore."""
    return [
        *lives.to_running(a, gpu=True, devices=2),
        events.CudaContextOpened(actor_id=a, pid=7),
        events.SuspendRequested(actor_id=a),
        events.LiveContextFound(actor_id=a, route=events.ROUTE_EXEC),
        events.CudaSuspended(actor_id=a, pids="7"),
        events.CheckpointWritten(actor_id=a, image_path=f"/ck/{a}/1"),
        *lives.restored_to_running(a, gpu=True, image_path=f"/ck/{a}/1", devices=2, cuda_pids="7"),
        events.SuspendRequested(actor_id=a),
        events.NoLiveContext(actor_id=a),
        events.CheckpointWritten(actor_id=a, image_path=f"/ck/{a}/2"),
        events.DeleteRequested(actor_id=a),
        events.Deleted(actor_id=a),
    ]


def _cpu_life(a: str) -> list[events.Event]:
    """A CPU actor: a suspend refused for a live context, then suspended and restored."""
    return [
        *lives.to_running(a, gpu=False),
        events.CudaContextOpened(actor_id=a, pid=9),
        events.SuspendRequested(actor_id=a),  # refused by the machine: a live context
        events.CudaContextClosed(actor_id=a, pid=9),
        events.SuspendRequested(actor_id=a),
        events.CheckpointWritten(actor_id=a, image_path=f"/ck/{a}/1"),
        *lives.restored_to_running(a, gpu=False, image_path=f"/ck/{a}/1"),
        events.DeleteRequested(actor_id=a),
        events.Deleted(actor_id=a),
    ]


def _stream(n: int) -> list[events.Event]:
    """Whole lives of ``n`` actors (every other one a GPU actor), interleaved round-robin."""
    lives = [(_gpu_life if i % 2 == 0 else _cpu_life)(f"actor-{i}") for i in range(n)]
    longest = max(len(life) for life in lives)
    return [life[k] for k in range(longest) for life in lives if k < len(life)]


def bench_core(n: int, rounds: int = 2) -> tuple[dict[str, float], int]:
    """Events/s applying the stream across ``n`` actors, per engine (best of ``rounds``,
    engines in alternating order so none always runs first); and the event count."""
    stream = _stream(n)
    out: dict[str, float] = {}
    for r in range(rounds):
        for name in list(ENGINES)[:: 1 if r % 2 == 0 else -1]:
            actor_table = table.ActorTable(SPEC, ENGINES[name](SPEC))  # type: ignore[call-arg]
            gc.collect()
            start = time.perf_counter()
            for event in stream:
                actor_table.apply(event)
            rate = len(stream) / (time.perf_counter() - start)
            out[name] = max(out.get(name, 0.0), rate)
            assert actor_table.state_counts()["deleted"] == n
            assert actor_table.last_seq == len(stream)  # every event of the lives was accepted
    return {name: out[name] for name in ENGINES}, len(stream)


class _Count(hooks.TransitionObserver):
    """Counts accepted events (each is one transition, reflexive ones included)."""

    def __init__(self) -> None:
        self.accepted = 0

    def on_transition(self, t: hooks.Transition) -> None:
        self.accepted += 1


async def _agent_lives(n: int, engine: str) -> float:
    runtime = _MemoryRuntime()
    seen = _Count()
    # Checkpoint directories on a tmpfs when there is one: the manifests' fsyncs are not
    # what this measures (bench_eventlog and bench_injection time the disk).
    with TemporaryDirectory(dir=_TMPFS if _TMPFS.is_dir() else None) as tmp:
        async with Agent(
            runtime=runtime,
            probe=_NoClients(),
            injector=FakeInjector(),
            checkpoint_root=Path(tmp),
            observers=[seen],
            queue_size=4096,
            concurrency=256,
        ) as agent:
            if engine != "interpreter":
                # The same pipeline and table over another engine (benchmark only).
                actor_table = agent._table
                actor_table._engine = ENGINES[engine](SPEC)  # type: ignore[call-arg]
                actor_table._moves = actor_table._engine.moves
            start = time.perf_counter()
            ids = [f"actor-{i}" for i in range(n)]
            phases: list[tuple[list[events.Event], str]] = [
                (
                    [events.ActorRegistered(actor_id=a, gpu=True, bundle=f"/b/{a}") for a in ids],
                    "registered",
                ),
                (
                    [events.BundlePrepared(actor_id=a, bundle=f"/b/{a}") for a in ids],
                    "bundle_prepared",
                ),
                ([events.RunRequested(actor_id=a) for a in ids], "running"),
                # GPU actors are probed: no live client, so checkpointed.
                ([events.SuspendRequested(actor_id=a) for a in ids], "suspended"),
                ([events.RestoreRequested(actor_id=a) for a in ids], "running"),
                ([events.DeleteRequested(actor_id=a) for a in ids], "deleted"),
            ]
            for phase, resting in phases:
                for event in phase:
                    await agent.submit(event)
                await agent.settle()
                counts = agent.state_counts()
                assert counts[resting] == n, (resting, counts)
            elapsed = time.perf_counter() - start
    return seen.accepted / elapsed


def bench_agent(n: int) -> dict[str, float]:
    """Events/s (submitted + effect outcomes, as counted) through the whole Agent."""
    return {name: anyio.run(_agent_lives, n, name) for name in ("interpreter", "dict-table floor")}


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
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, no targets checked")
    args = parser.parse_args()
    if args.smoke:
        args.actors, args.idle = 200, 2_000

    targets = _targets.Targets(smoke=args.smoke)
    core, count = bench_core(args.actors)
    print(f"synchronous core, {args.actors:,} actors, {count:,} events of whole lives (events/s)")
    for name, rate in core.items():
        print(f"  {name:<22} {rate:>12,.0f}   {rate / core['dict-table floor']:5.2f}x floor")
    ratio = core["interpreter"] / core["dict-table floor"]
    print(f"  {targets.judge('target core (interpreter) ≥ 0.5× floor', ratio >= 0.5)}")
    agent = bench_agent(args.actors)
    print(f"whole Agent pipeline, {args.actors:,} GPU actors (events/s, counted as accepted)")
    for name, rate in agent.items():
        print(f"  over the {name:<16} {rate:>12,.0f}")

    _, per_actor = anyio.run(lambda: _register(args.idle, measure_memory=True))
    memory = targets.judge("target ≤ 4,096 bytes per actor", per_actor <= 4096)
    print(f"memory per idle actor at {args.idle:,}: {per_actor:,.0f} bytes ({memory})")
    small, _ = anyio.run(lambda: _register(args.idle // 10, measure_memory=False))
    large, _ = anyio.run(lambda: _register(args.idle, measure_memory=False))
    linear = targets.judge("target registration ratio ≤ 11", large / small <= 11)
    print(
        f"register {args.idle // 10:,}: {small:.2f}s   register {args.idle:,}: {large:.2f}s   "
        f"ratio {large / small:.1f} ({linear})"
    )
    return targets.exit_status()


if __name__ == "__main__":
    raise SystemExit(main())
