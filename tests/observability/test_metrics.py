"""AgentMetrics: the metric families, their bounded labels, exemplars and the registry rules."""

from __future__ import annotations

import collections
import re
import typing
from pathlib import Path

import prometheus_client
import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

from substrate_gpu import preflight
from substrate_gpu.lifecycle import machine
from substrate_gpu.observability import metrics
from substrate_gpu.observability.metrics import AgentMetrics
from substrate_gpu.service import wiring

from .scrape import samples, value

RULES = Path(__file__).resolve().parents[2] / "metrics" / "rules" / "substrate-gpu.yml"


def _text(registry: CollectorRegistry) -> str:
    return generate_latest(registry).decode()


def _openmetrics(registry: CollectorRegistry) -> str:
    return str(generate_openmetrics(registry).decode())  # type: ignore[no-untyped-call]


def test_nothing_is_registered_in_the_global_registry() -> None:
    """Importing and constructing AgentMetrics leaves prometheus_client.REGISTRY alone."""
    AgentMetrics(CollectorRegistry(), actor_states=dict)
    names = {family.name for family in prometheus_client.REGISTRY.collect()}
    assert not any(name.startswith("substrate_gpu") for name in names)


def test_two_agents_in_one_process_do_not_collide() -> None:
    """Each AgentMetrics owns its registry, so two can coexist (two agents, two tests)."""
    first, second = CollectorRegistry(), CollectorRegistry()
    AgentMetrics(first).transition("registered", "bundle_prepared", "bundle_prepared")
    AgentMetrics(second)
    key = {"from": "registered", "to": "bundle_prepared", "trigger": "bundle_prepared"}
    assert value(_text(first), "substrate_gpu_actor_transitions_total", **key) == 1
    assert value(_text(second), "substrate_gpu_actor_transitions_total", **key) is None


def test_actors_by_state_come_from_the_callable_at_scrape_time(
    registry: CollectorRegistry,
) -> None:
    """substrate_gpu_actors reads the lifecycle's counts on each scrape, not before."""
    counts: collections.Counter[str] = collections.Counter()
    calls = 0

    def actor_states() -> collections.Counter[str]:
        nonlocal calls
        calls += 1
        return counts

    AgentMetrics(registry, actor_states=actor_states)
    assert calls == 0, "registration must not call the lifecycle"
    counts["running"] = 3
    counts["suspended"] = 1
    text = _text(registry)
    assert value(text, "substrate_gpu_actors", state="running") == 3
    assert value(text, "substrate_gpu_actors", state="suspended") == 1
    counts["running"] -= 1
    assert value(_text(registry), "substrate_gpu_actors", state="running") == 2


def test_every_known_state_is_exported_even_when_empty(registry: CollectorRegistry) -> None:
    """Alerts see a stable set of series: all states at 0 rather than absent."""
    AgentMetrics(registry, actor_states=dict)
    exported = {
        s.labels["state"] for s in samples(_text(registry)) if s.name == "substrate_gpu_actors"
    }
    assert exported == metrics.ACTOR_STATES


def test_unknown_states_are_summed_under_other(registry: CollectorRegistry) -> None:
    """A state outside the known set is reported as state="other", never as itself."""
    AgentMetrics(registry, actor_states=lambda: {"weird": 2, "stranger": 1, "running": 1})
    text = _text(registry)
    assert value(text, "substrate_gpu_actors", state="other") == 3
    assert value(text, "substrate_gpu_actors", state="weird") is None


def test_states_can_come_from_the_lifecycle_machine(registry: CollectorRegistry) -> None:
    """``states=`` replaces the default state list (labels and the actors gauge)."""
    m = AgentMetrics(registry, actor_states=lambda: {"alpha": 1}, states=["alpha", "beta"])
    m.transition("alpha", "beta", "go")
    text = _text(registry)
    assert value(text, "substrate_gpu_actors", state="beta") == 0
    assert value(text, "substrate_gpu_actor_transitions_total", to="beta") == 1


@pytest.mark.parametrize(
    ("call", "name", "labels"),
    [
        pytest.param(
            lambda m: m.transition("running", "probing", "suspend_requested"),
            "substrate_gpu_actor_transitions_total",
            {"from": "running", "to": "probing", "trigger": "suspend_requested"},
            id="transition",
        ),
        pytest.param(
            lambda m: m.checkpoint_refused("live_cuda_context"),
            "substrate_gpu_checkpoint_refusals_total",
            {"reason": "live_cuda_context"},
            id="checkpoint-refused",
        ),
        pytest.param(
            lambda m: m.checkpoint_failed("live_nvproxy_clients"),
            "substrate_gpu_checkpoint_failures_total",
            {"reason": "live_nvproxy_clients"},
            id="checkpoint-failed",
        ),
        pytest.param(
            lambda m: m.injection_hook_skipped("update-ldcache"),
            "substrate_gpu_injection_hooks_skipped_total",
            {"hook": "update-ldcache"},
            id="hook-skipped",
        ),
        pytest.param(
            lambda m: m.event_rejected("invalid_in_state"),
            "substrate_gpu_events_rejected_total",
            {"reason": "invalid_in_state"},
            id="event-rejected",
        ),
    ],
)
def test_counters_count_by_their_labels(
    registry: CollectorRegistry, call: object, name: str, labels: dict[str, str]
) -> None:
    """Each counting method increments its family under the given (known) labels."""
    m = AgentMetrics(registry)
    call(m)  # type: ignore[operator]
    call(m)  # type: ignore[operator]
    assert value(_text(registry), name, **labels) == 2


@pytest.mark.parametrize(
    ("call", "name", "labels"),
    [
        pytest.param(
            lambda m: m.transition("actor-123", "nowhere", "xyzzy"),
            "substrate_gpu_actor_transitions_total",
            {"from": "other", "to": "other", "trigger": "other"},
            id="transition",
        ),
        pytest.param(
            lambda m: m.checkpoint_refused("because I said so"),
            "substrate_gpu_checkpoint_refusals_total",
            {"reason": "other"},
            id="refusal-reason",
        ),
        pytest.param(
            lambda m: m.checkpoint_failed("segfault at 0x0"),
            "substrate_gpu_checkpoint_failures_total",
            {"reason": "other"},
            id="failure-reason",
        ),
        pytest.param(
            lambda m: m.injection_hook_skipped("/usr/bin/evil --flag"),
            "substrate_gpu_injection_hooks_skipped_total",
            {"hook": "other"},
            id="hook",
        ),
        pytest.param(
            lambda m: m.effect_finished("runsc_create", "exploded", 1.0),
            "substrate_gpu_runtime_operation_duration_seconds_count",
            {"effect": "runsc_create", "outcome": "other"},
            id="outcome",
        ),
        pytest.param(
            lambda m: m.toolkit_generation("segv", 1.0),
            "substrate_gpu_toolkit_generation_duration_seconds_count",
            {"outcome": "other"},
            id="toolkit-outcome",
        ),
        pytest.param(
            lambda m: m.event_rejected("no idea"),
            "substrate_gpu_events_rejected_total",
            {"reason": "other"},
            id="rejection-reason",
        ),
    ],
)
def test_unknown_label_values_become_other(
    registry: CollectorRegistry, call: object, name: str, labels: dict[str, str]
) -> None:
    """Values outside the bounded sets are recorded as "other": cardinality stays bounded."""
    m = AgentMetrics(registry)
    call(m)  # type: ignore[operator]
    assert value(_text(registry), name, **labels) == 1


def test_actor_ids_never_become_label_values(registry: CollectorRegistry) -> None:
    """1,000 actors' worth of calls, with ids everywhere, leave no id in any label."""
    m = AgentMetrics(registry, actor_states=lambda: {"running": 1000})
    for i in range(1000):
        actor = f"actor-{i:04d}"
        m.transition("registered", "bundle_prepared", "bundle_prepared", actor_id=actor)
        m.checkpoint_refused("live_cuda_context", actor_id=actor)
        m.effect_finished("inject_gpu", "ok", 0.002, actor_id=actor)
        m.devices_injected(2, actor_id=actor)
    label_values = {v for s in samples(_text(registry)) for v in s.labels.values()}
    assert not any(v.startswith("actor-") for v in label_values)


def test_actor_id_is_an_exemplar_in_openmetrics(registry: CollectorRegistry) -> None:
    """The optional actor_id is attached as an exemplar, visible in OpenMetrics output."""
    m = AgentMetrics(registry)
    m.checkpoint_refused("live_cuda_context", actor_id="actor-7")
    m.effect_finished("inject_gpu", "ok", 0.003, actor_id="actor-8")
    om = _openmetrics(registry)
    assert re.search(
        r'^substrate_gpu_checkpoint_refusals_total\{reason="live_cuda_context"\} 1\.0 '
        r'# \{actor_id="actor-7"\} 1\.0',
        om,
        re.MULTILINE,
    )
    assert '# {actor_id="actor-8"} 0.003' in om
    assert "actor-7" not in _text(registry), "classic text carries no exemplars"


def test_an_overlong_actor_id_is_dropped_not_truncated(registry: CollectorRegistry) -> None:
    """OpenMetrics caps exemplar labels at 128 characters; a longer id is left out, still counted."""
    m = AgentMetrics(registry)
    m.checkpoint_refused("live_cuda_context", actor_id="a" * 200)
    assert "aaaa" not in _openmetrics(registry)
    assert (
        value(
            _text(registry), "substrate_gpu_checkpoint_refusals_total", reason="live_cuda_context"
        )
        == 1
    )


@pytest.mark.parametrize(
    ("effect", "histogram", "effect_label"),
    [
        pytest.param(
            "inject_gpu",
            "substrate_gpu_injection_duration_seconds",
            "inject_gpu",
            id="injection-ms",
        ),
        pytest.param(
            "stage_soname_links",
            "substrate_gpu_injection_duration_seconds",
            "stage_soname_links",
            id="soname-ms",
        ),
        pytest.param(
            "runsc_restore",
            "substrate_gpu_runtime_operation_duration_seconds",
            "runsc_restore",
            id="runsc-seconds",
        ),
        pytest.param(
            "mystery",
            "substrate_gpu_runtime_operation_duration_seconds",
            "other",
            id="unknown-to-runtime-other",
        ),
    ],
)
def test_effects_are_routed_to_the_histogram_whose_buckets_suit_them(
    registry: CollectorRegistry, effect: str, histogram: str, effect_label: str
) -> None:
    """Injection effects land in millisecond buckets; runsc operations in second buckets."""
    AgentMetrics(registry).effect_finished(effect, "ok", 0.004)
    text = _text(registry)
    assert value(text, f"{histogram}_count", effect=effect_label, outcome="ok") == 1
    assert value(text, f"{histogram}_sum", effect=effect_label, outcome="ok") == 0.004


def test_injection_buckets_resolve_milliseconds_and_runtime_buckets_minutes(
    registry: CollectorRegistry,
) -> None:
    """The millisecond histogram has sub-ms buckets; the runtime one reaches 5 minutes."""
    AgentMetrics(registry)
    bounds: dict[str, set[float]] = collections.defaultdict(set)
    for s in samples(_text(registry)):
        if s.name.endswith("_bucket"):
            bounds[s.name].add(float(s.labels["le"]))
    assert min(bounds["substrate_gpu_injection_duration_seconds_bucket"]) <= 0.001
    assert 300.0 in bounds["substrate_gpu_runtime_operation_duration_seconds_bucket"]


def test_series_alerts_take_increase_of_exist_at_zero(registry: CollectorRegistry) -> None:
    """Failure counters exist at 0 before the first failure, so increase() sees it."""
    AgentMetrics(
        registry,
        transitions=[("creating", "failed", "effect_failed")],
    )
    text = _text(registry)
    for reason in metrics.CHECKPOINT_FAILURE_REASONS:
        assert value(text, "substrate_gpu_checkpoint_failures_total", reason=reason) == 0
    for reason in metrics.CHECKPOINT_REFUSAL_REASONS:
        assert value(text, "substrate_gpu_checkpoint_refusals_total", reason=reason) == 0
    assert (
        value(text, "substrate_gpu_toolkit_generation_duration_seconds_count", outcome="error") == 0
    )
    assert (
        value(
            text,
            "substrate_gpu_runtime_operation_duration_seconds_count",
            effect="runsc_restore",
            outcome="timeout",
        )
        == 0
    )
    assert value(text, "substrate_gpu_actor_transitions_total", to="failed") == 0


def test_devices_injected_is_a_histogram_of_devices_per_actor(
    registry: CollectorRegistry,
) -> None:
    """Two actors with 1 and 4 devices: count 2, sum 5."""
    m = AgentMetrics(registry)
    m.devices_injected(1)
    m.devices_injected(4)
    text = _text(registry)
    assert value(text, "substrate_gpu_injected_devices_count") == 2
    assert value(text, "substrate_gpu_injected_devices_sum") == 5


def test_event_log_append_records_latency_and_batch_size(registry: CollectorRegistry) -> None:
    """One group commit of 32 events taking 2 ms feeds both histograms."""
    AgentMetrics(registry).event_log_append(0.002, 32)
    text = _text(registry)
    assert value(text, "substrate_gpu_event_log_append_duration_seconds_sum") == 0.002
    assert value(text, "substrate_gpu_event_log_fsync_batch_size_sum") == 32
    assert value(text, "substrate_gpu_event_log_fsync_batch_size_bucket", le="32.0") == 1


def test_queue_depth_is_set_by_the_method(registry: CollectorRegistry) -> None:
    """Without a source callable, queue_depth(n) sets the gauge."""
    m = AgentMetrics(registry)
    m.queue_depth(17)
    assert value(_text(registry), "substrate_gpu_event_queue_depth") == 17


def test_queue_depth_source_wins_over_the_method(registry: CollectorRegistry) -> None:
    """With a source callable, the gauge is read from it at scrape time."""
    depth = [5]
    m = AgentMetrics(registry, queue_depth=lambda: depth[0])
    m.queue_depth(99)
    depth[0] = 6
    assert value(_text(registry), "substrate_gpu_event_queue_depth") == 6


def test_build_info_names_the_version(registry: CollectorRegistry) -> None:
    """substrate_gpu_build_info is 1 with the version label."""
    AgentMetrics(registry, version="9.9.9")
    assert value(_text(registry), "substrate_gpu_build_info", version="9.9.9") == 1


def test_series_count_does_not_depend_on_the_number_of_actors() -> None:
    """10 actors or 10,000 through the same lifecycle: the same number of series."""

    def series(actors: int) -> int:
        registry = CollectorRegistry()
        counts = collections.Counter({"running": actors})
        m = AgentMetrics(registry, actor_states=lambda: counts)
        for i in range(actors):
            m.transition("starting", "running", "sandbox_started", actor_id=f"a{i}")
            m.devices_injected(1, actor_id=f"a{i}")
        return len(samples(_text(registry)))

    assert series(10) == series(10_000)


def _transitional_rule() -> tuple[dict[str, str], list[dict[str, str]]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    rules = [r for g in groups for r in g["rules"]]
    rule = next(r for r in rules if r.get("record") == "substrate_gpu:actors_transitional")
    return rule, [r for r in rules if r is not rule]


def test_the_agent_labels_exactly_the_machines_in_flight_states() -> None:
    """``substrate_gpu_actors{in_flight="true"}`` is exactly the states of
    machines/actor.yaml that run an effect (what the transitional rule selects)."""
    spec = machine.load_spec()
    registry = CollectorRegistry()
    wiring.agent_metrics(registry, spec, dict)
    flags = {
        s.labels["state"]: s.labels["in_flight"]
        for s in samples(_text(registry))
        if s.name == "substrate_gpu_actors"
    }
    assert {state for state, flag in flags.items() if flag == "true"} == set(spec.effects)
    assert set(flags) == set(spec.state_names)


def test_the_transitional_rule_names_no_state() -> None:
    """The rule selects ``in_flight="true"``: a state added to the machine needs no edit in
    metrics/rules."""
    rule, _ = _transitional_rule()
    assert 'in_flight="true"' in rule["expr"]
    assert "state=" not in rule["expr"]


def test_the_transitional_regex_lives_in_one_rule() -> None:
    """Alerts use the recorded series; no other rule repeats a state regex."""
    _, others = _transitional_rule()
    assert not any("state=~" in r["expr"] for r in others)


def test_the_default_label_sets_are_the_machines() -> None:
    """Without ``states=``/``triggers=``, the labels are the machine's states and triggers."""
    spec = machine.load_spec()
    assert set(spec.state_names) == metrics.ACTOR_STATES
    assert {t.trigger for t in spec.transitions} == metrics.TRIGGERS


def test_every_preflight_refusal_code_is_a_refusal_label() -> None:
    """A restore_refused/preflight_refused code is counted under its own label, not folded
    into another (issue 26 added restore-gpu-remap and restore-gpu-memory)."""
    codes = set(typing.get_args(preflight.RefusalCode))
    assert codes <= metrics.CHECKPOINT_REFUSAL_REASONS, codes - metrics.CHECKPOINT_REFUSAL_REASONS
