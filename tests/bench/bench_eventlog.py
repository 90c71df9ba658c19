"""Benchmark: event-log appends (group commit against one fsync per event) and replay.

Run: ``.venv/bin/python tests/bench/bench_eventlog.py [--base DIR] [--events 1000000] [--smoke]``.
Not collected by pytest. Printed side by side, in one run, on the same disk (``--base``,
default /var/tmp):

- appends/s through :class:`EventLog` with group commit (64 concurrent recorders, as an
  agent's effects and submitters are), against one ``fdatasync`` per event (one recorder
  awaiting each append: what a log without group commit does for every event);
- replay of a generated log of ``--events`` events (default one million; target ≥ 200,000
  events/s) through the real machine: read + parse + apply + transitions, and the parts
  (best of ``--repeat`` runs: a shared machine's noise only ever slows a run down).

The replay log is generated quickly but honestly: one GPU actor's real life is recorded by
an Agent on the lifecycle's doubles (so every line is what the agent writes for the current
machine), then stamped out for as many actors as needed, interleaved 1,000 actors at a time,
with fresh actor ids and increasing seqs.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for lifecycle.*

import _targets
from lifecycle.doubles import FakeInjector, FakeProbe, FakeRuntime
from lifecycle.factories import bring_to_running

from substrate_gpu.eventlog import EventLog, read_log, replay
from substrate_gpu.eventlog.replayer import Replayer, TransitionList
from substrate_gpu.lifecycle import Agent, events

SENTINEL = "__actor__"


# --- appends -----------------------------------------------------------------------------


class _Batches:
    def __init__(self) -> None:
        self.sizes: list[int] = []

    def event_log_append(self, seconds: float, batch_size: int) -> None:
        self.sizes.append(batch_size)


def _events(n: int) -> list[events.Event]:
    return [
        events.ActorRegistered(actor_id=f"actor-{i:07d}", gpu=True, bundle=f"/b/{i}", seq=i + 1)
        for i in range(n)
    ]


async def _group_commit(path: Path, n: int, recorders: int) -> tuple[float, _Batches]:
    batches = _Batches()
    todo = _events(n)
    async with await EventLog.open(path, rotate_bytes=None, metrics=batches) as log:
        started = time.perf_counter()
        # At most ``recorders`` records in flight; tasks start (and so enqueue) in seq order.
        slots = anyio.Semaphore(recorders)

        async def one(event: events.Event) -> None:
            try:
                await log.record(event)
            finally:
                slots.release()

        async with anyio.create_task_group() as tg:
            for event in todo:
                await slots.acquire()
                tg.start_soon(one, event)
        elapsed = time.perf_counter() - started
    return elapsed, batches


async def _one_fsync_each(path: Path, n: int) -> tuple[float, _Batches]:
    batches = _Batches()
    async with await EventLog.open(path, rotate_bytes=None, metrics=batches) as log:
        started = time.perf_counter()
        for event in _events(n):
            await log.record(event)
        elapsed = time.perf_counter() - started
    return elapsed, batches


# --- replay ------------------------------------------------------------------------------


async def _template(tmp: Path, *, registration: int = 2) -> list[str]:
    """One GPU actor's whole life as the agent logs it (actor id replaced by a sentinel).

    ``registration=1``: the actor is registered by an ``actor_registered`` v1 line, as logs
    written before GPU allocation were (no allocator: no ``gpus_allocated``), and written
    without the fields v1 did not have (their defaults): a log older code can read too."""
    runtime = FakeRuntime()
    path = tmp / f"template-v{registration}.jsonl"
    async with await EventLog.open(path, rotate_bytes=None) as log:
        async with Agent(
            runtime=runtime,
            probe=FakeProbe(runtime),
            injector=FakeInjector(),
            checkpoint_root=Path("/ck"),
            recorder=log,
        ) as agent:
            a = SENTINEL
            if registration == 1:
                await agent.submit(
                    events.ActorRegistered(actor_id=a, gpu=True, bundle=f"/b/{a}", v=1)
                )
                await agent.submit(events.BundlePrepared(actor_id=a, bundle=f"/b/{a}"))
                await agent.submit(events.RunRequested(actor_id=a))
                await agent.wait_for_state(a, "running", timeout=5)
            else:
                await bring_to_running(agent, a)
            for _ in range(3):
                runtime.open_context(a)
                await agent.submit(events.CudaContextOpened(actor_id=a, pid=7))
                runtime.close_context(a)
                await agent.submit(events.CudaContextClosed(actor_id=a, pid=7))
                await agent.submit(events.SuspendRequested(actor_id=a))
                await agent.wait_for_state(a, "suspended", timeout=5)
                await agent.submit(events.BundlePrepared(actor_id=a, bundle=f"/b/{a}"))
                await agent.submit(events.RestoreRequested(actor_id=a))
                await agent.wait_for_state(a, "running", timeout=5)
            await agent.submit(events.DeleteRequested(actor_id=a))
            await agent.wait_for_state(a, "deleted", timeout=5)
    out = []
    for line in path.read_text().splitlines()[1:]:
        record = {**json.loads(line), "seq": 0}
        if record.get("v") == 1 and record["type"] == "actor_registered":
            for name, default in (("gpus", 0), ("gpu_names", [])):
                if record.get(name) == default:
                    del record[name]
        out.append(json.dumps(record, separators=(",", ":")))
    return out


def _generate(path: Path, template: list[str], n_events: int) -> int:
    """Stamp the template out for enough actors; the number of events written."""
    header = path.read_text() if path.exists() else ""
    per_actor = len(template)
    actors = -(-n_events // per_actor)
    seq = 0
    with path.open("w") as f:
        f.write(header)
        for first in range(0, actors, 1000):
            group = [f"actor-{i:07d}" for i in range(first, min(first + 1000, actors))]
            for step in template:
                head, tail = step.split('"seq":0', 1)
                out = []
                for actor in group:
                    seq += 1
                    out.append(
                        f'{head.replace(SENTINEL, actor)}"seq":{seq}{tail.replace(SENTINEL, actor)}\n'
                    )
                    if seq == n_events:
                        break
                f.write("".join(out))
                if seq == n_events:
                    return seq
    return seq


def _timed(fn: Callable[[], object], repeat: int) -> tuple[float, object]:
    """The best of ``repeat`` runs (the machine may be shared) and the last run's result."""
    best, result = float("inf"), None
    for _ in range(repeat):
        result = None
        gc.collect()
        started = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - started)
    return best, result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", type=Path, default=Path("/var/tmp"), help="where the logs go")
    parser.add_argument("--events", type=int, default=1_000_000, help="events in the replay log")
    parser.add_argument("--appends", type=int, default=20_000, help="events for group commit")
    parser.add_argument("--single", type=int, default=2_000, help="events for one fsync each")
    parser.add_argument("--recorders", type=int, default=64, help="concurrent recorders")
    parser.add_argument("--repeat", type=int, default=3, help="replay timings: best of N")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="tiny sizes, a few seconds, nothing judged (the test suite runs this)",
    )
    args = parser.parse_args()
    if args.smoke:
        args.events, args.appends, args.single, args.recorders, args.repeat = 500, 200, 20, 8, 1

    with tempfile.TemporaryDirectory(dir=args.base, prefix="bench-eventlog-") as tmp_name:
        tmp = Path(tmp_name)
        print(f"event log benchmark in {tmp} ({os.uname().sysname}, {os.cpu_count()} CPUs)\n")

        gc_elapsed, gc_batches = anyio.run(
            _group_commit, tmp / "group.jsonl", args.appends, args.recorders
        )
        one_elapsed, one_batches = anyio.run(_one_fsync_each, tmp / "single.jsonl", args.single)
        print("appends (fsync before record returns)")
        print(f"  {'mode':<34} {'events':>8} {'fsyncs':>7} {'mean batch':>10} {'events/s':>10}")
        for name, n, elapsed, batches in (
            (f"group commit, {args.recorders} recorders", args.appends, gc_elapsed, gc_batches),
            ("one fsync per event", args.single, one_elapsed, one_batches),
        ):
            sizes = batches.sizes
            print(
                f"  {name:<34} {n:>8} {len(sizes):>7} {sum(sizes) / len(sizes):>10.1f} "
                f"{n / elapsed:>10,.0f}"
            )
        print(
            f"  group commit speed-up: {(args.appends / gc_elapsed) / (args.single / one_elapsed):.1f}x\n"
        )

        template = anyio.run(_template, tmp)
        log = tmp / "replay.jsonl"
        anyio.run(_create_empty, log)
        started = time.perf_counter()
        n = _generate(log, template, args.events)
        generated = time.perf_counter() - started
        size = log.stat().st_size
        print(
            f"replay of {n:,} events ({size / 2**20:.0f} MiB, {len(template)} events per actor "
            f"life, generated in {generated:.1f}s)"
        )
        read_s, contents = _timed(lambda: read_log(log), args.repeat)

        def apply_only() -> int:
            replayer = Replayer()
            return replayer.feed(log, contents.records, TransitionList(), [])  # type: ignore[attr-defined]

        apply_s, _ = _timed(apply_only, args.repeat)
        full_s, result = _timed(lambda: replay(log), args.repeat)
        lean_s, _ = _timed(lambda: replay(log, keep_transitions=False), args.repeat)
        listed_s, _ = _timed(lambda: list(result.transitions), 1)  # type: ignore[attr-defined]
        assert result.events_replayed == n, result.events_replayed  # type: ignore[attr-defined]
        print(f"  {'part':<44} {'seconds':>8} {'events/s':>10}")
        for name, seconds in (
            ("read + parse (read_log)", read_s),
            ("machine + transitions (Replayer.feed)", apply_s),
            ("replay(): read, parse, machine, transitions", full_s),
            ("replay(keep_transitions=False)", lean_s),
            ("building every Transition object afterwards", listed_s),
        ):
            print(f"  {name:<44} {seconds:>8.2f} {n / seconds:>10,.0f}")
        targets = _targets.Targets(smoke=args.smoke)
        print(f"  {targets.judge('target ≥ 200,000 events/s for replay()', n / full_s >= 200_000)}")
    return targets.exit_status()


async def _create_empty(path: Path) -> None:
    async with await EventLog.open(path, rotate_bytes=None):
        pass


if __name__ == "__main__":
    sys.exit(main())
