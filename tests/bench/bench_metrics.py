"""Benchmark: rendering /metrics with 100,000 actors against an empty registry.

Run: ``.venv/bin/python tests/bench/bench_metrics.py [--actors 100000] [--smoke]``.
Target: ≤ 50 ms per render at 100,000 actors, and the same number of series as with no
actor at all (the per-state gauge is read from incrementally kept counts, and actor ids
never become label values).

The actors live the machine's real lives through the lifecycle's own table and interpreter
(``ActorTable.apply``), and the metrics are declared and fed exactly as the agent does
(``service.wiring.agent_metrics``: the machine's states, triggers and transitions); every
transition recorded is counted from what the table accepted, none is assumed.
``--smoke``: 500 actors, a few renders, no target checked.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import _targets
from prometheus_client import CollectorRegistry, generate_latest

from substrate_gpu.lifecycle import events, machine, table
from substrate_gpu.observability.metrics import AgentMetrics
from substrate_gpu.service import wiring
from substrate_gpu.testing import lives

TARGET_MS = 50.0
SPEC = machine.load_spec()


def _life(a: str, gpu: bool, suspend: bool) -> list[events.Event]:
    """Run (inject for GPU), a suspend refused for a live context, then (half the actors)
    suspended: GPU actors are probed first."""
    life: list[events.Event] = [
        *lives.to_running(a, gpu=gpu, devices=2),
        events.CudaContextOpened(actor_id=a, pid=7),
    ]
    if gpu:
        # Probed: the live context has no route here, so the probe refuses.
        life += [
            events.SuspendRequested(actor_id=a),
            events.CheckpointRefused(
                actor_id=a, reason=events.REFUSED_LIVE_CONTEXT_PROBED, sandbox_survived=True
            ),
        ]
    else:
        life.append(events.SuspendRequested(actor_id=a))  # refused by the machine
    life.append(events.CudaContextClosed(actor_id=a, pid=7))
    if suspend:
        life.append(events.SuspendRequested(actor_id=a))
        if gpu:
            life.append(events.NoLiveContext(actor_id=a))
        life.append(events.CheckpointWritten(actor_id=a, image_path=f"/ck/{a}/1"))
    return life


def _render_ms(registry: CollectorRegistry, renders: int) -> tuple[float, float, int]:
    """(median ms, max ms, series count) over ``renders`` renders."""
    times = []
    body = b""
    for _ in range(renders):
        start = time.perf_counter()
        body = generate_latest(registry)
        times.append((time.perf_counter() - start) * 1000)
    series = sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))
    assert b'"other"' not in body, "a lifecycle label fell outside the machine's label sets"
    return statistics.median(times), max(times), series


def _empty() -> CollectorRegistry:
    registry = CollectorRegistry()
    wiring.agent_metrics(registry, SPEC, dict)
    return registry


def _populated(n: int) -> tuple[CollectorRegistry, float, int]:
    """A registry fed by ``n`` actors' lives: (registry, seconds, transitions recorded)."""
    actor_table = table.ActorTable(SPEC)
    registry = CollectorRegistry()
    m: AgentMetrics = wiring.agent_metrics(registry, SPEC, actor_table.state_counts)
    bridge = wiring.LifecycleMetricsBridge(m)
    recorded = 0
    start = time.perf_counter()
    for i in range(n):
        actor_id = f"actor-{i:06d}"
        gpu = i % 2 == 0
        for event in _life(actor_id, gpu, suspend=i % 4 < 2):
            step = actor_table.apply(event)
            m.transition(step.source, step.dest, step.event.type, actor_id=actor_id)
            if step.refusal is not None:
                bridge.checkpoint_refused(step.refusal)
            recorded += 1
        effect, outcome = ("inject", "gpu_injected") if gpu else ("create", "sandbox_created")
        bridge.effect_finished(effect, outcome, 0.003)
        m.devices_injected(1 + i % 8, actor_id=actor_id)
    record_s = time.perf_counter() - start
    counts = actor_table.state_counts()
    assert sum(counts.values()) == len(actor_table) == n
    assert {s for s, c in counts.items() if c} == {"running", "suspended"}
    return registry, record_s, recorded


def _report(label: str, measure: Callable[[], tuple[float, float, int]]) -> tuple[float, int]:
    median_ms, max_ms, series = measure()
    print(f"{label:<28} render median {median_ms:7.2f} ms  max {max_ms:7.2f} ms  series {series}")
    return median_ms, series


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--actors", type=int, default=100_000)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, no target checked")
    args = parser.parse_args()
    n, renders = (500, 3) if args.smoke else (args.actors, 50)
    empty = _empty()
    populated, record_s, transitions = _populated(n)
    print(
        f"recorded {transitions:,} transitions for {n:,} actors in {record_s:.2f} s "
        f"({record_s / transitions * 1e6:.2f} µs per transition, machine included)"
    )
    _, empty_series = _report("empty registry", lambda: _render_ms(empty, renders))
    median_ms, series = _report(f"{n:,} actors", lambda: _render_ms(populated, renders))
    targets = _targets.Targets(smoke=args.smoke)
    print(targets.judge(f"render median ≤ {TARGET_MS:.0f} ms", median_ms <= TARGET_MS))
    print(targets.judge("series independent of actor count", series == empty_series))
    return targets.exit_status()


if __name__ == "__main__":
    raise SystemExit(main())
