"""Benchmark: rendering /metrics with 100,000 actors against an empty registry.

Run: ``.venv/bin/python tests/bench/bench_metrics.py [--smoke]``. Target: ≤ 50 ms per render at
100,000 actors, and the same number of series as with no actor at all (the per-state
gauge is read from incrementally kept counts, and actor ids never become label values).
"""

from __future__ import annotations

import argparse
import collections
import statistics
import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry, generate_latest

from substrate_gpu.observability import AgentMetrics

ACTORS = 100_000
RENDERS = 50
TARGET_MS = 50.0

# One actor's life up to running, and a suspend refused (live CUDA context) then accepted.
_LIFE = (
    ("registered", "bundle_prepared", "bundle_prepared"),
    ("bundle_prepared", "injecting", "inject"),
    ("injecting", "gpu_injected", "injected"),
    ("gpu_injected", "creating", "create"),
    ("creating", "sandbox_created", "created"),
    ("sandbox_created", "starting", "start"),
    ("starting", "running", "started"),
    ("running", "probing", "suspend"),
    ("probing", "running", "checkpoint_refused"),
    ("running", "probing", "suspend"),
    ("probing", "checkpointing", "checkpoint"),
    ("checkpointing", "suspended", "checkpointed"),
)
_FINAL_STATES = ("running", "suspended")


def _render_ms(registry: CollectorRegistry) -> tuple[float, float, int]:
    """(median ms, max ms, series count) over RENDERS renders."""
    times = []
    body = b""
    for _ in range(RENDERS):
        start = time.perf_counter()
        body = generate_latest(registry)
        times.append((time.perf_counter() - start) * 1000)
    series = sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))
    return statistics.median(times), max(times), series


def _empty() -> CollectorRegistry:
    registry = CollectorRegistry()
    AgentMetrics(registry, actor_states=dict, queue_depth=lambda: 0, transitions=_LIFE)
    return registry


def _populated() -> tuple[CollectorRegistry, float]:
    """A registry fed by ACTORS actor records and every transition of their lives."""
    # The lifecycle's side: actor records and per-state counts kept incrementally.
    actors: dict[str, str] = {}
    counts: collections.Counter[str] = collections.Counter()
    registry = CollectorRegistry()
    # As the lifecycle does: the machine's transitions are declared, so their series exist
    # (at 0) from the start; the series set is then fixed by the machine, not the actors.
    m = AgentMetrics(
        registry, actor_states=lambda: counts, queue_depth=lambda: 0, transitions=_LIFE
    )
    start = time.perf_counter()
    for i in range(ACTORS):
        actor_id = f"actor-{i:06d}"
        actors[actor_id] = "registered"
        counts["registered"] += 1
        life = _LIFE if i % 2 else _LIFE[:7]  # half end running, half suspended
        for source, dest, trigger in life:
            counts[source] -= 1
            counts[dest] += 1
            actors[actor_id] = dest
            m.transition(source, dest, trigger, actor_id=actor_id)
        m.effect_finished("inject_gpu", "ok", 0.003, actor_id=actor_id)
        m.effect_finished("runsc_create", "ok", 1.2, actor_id=actor_id)
        m.devices_injected(1 + i % 8, actor_id=actor_id)
    record_s = time.perf_counter() - start
    assert sum(counts.values()) == len(actors) == ACTORS
    assert set(actors.values()) == set(_FINAL_STATES)
    return registry, record_s


def _report(label: str, measure: Callable[[], tuple[float, float, int]]) -> tuple[float, int]:
    median_ms, max_ms, series = measure()
    print(f"{label:<28} render median {median_ms:7.2f} ms  max {max_ms:7.2f} ms  series {series}")
    return median_ms, series


def main() -> None:
    global ACTORS, RENDERS
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="tiny sizes, a few seconds, nothing judged (the test suite runs this)",
    )
    if parser.parse_args().smoke:
        ACTORS, RENDERS = 200, 2
    empty = _empty()
    populated, record_s = _populated()
    transitions = sum(len(_LIFE if i % 2 else _LIFE[:7]) for i in range(ACTORS))
    print(
        f"recorded {transitions:,} transitions for {ACTORS:,} actors in {record_s:.2f} s "
        f"({record_s / transitions * 1e6:.2f} µs per transition incl. effects)"
    )
    _, empty_series = _report("empty registry", lambda: _render_ms(empty))
    median_ms, series = _report(f"{ACTORS:,} actors", lambda: _render_ms(populated))
    print(f"series independent of actor count: {series == empty_series}")
    print(f"target ≤ {TARGET_MS:.0f} ms: {'met' if median_ms <= TARGET_MS else 'MISSED'}")


if __name__ == "__main__":
    main()
