"""metrics/: the scrape config and rule files pass promtool, and every alert is unit-tested."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from substrate_gpu.lifecycle import machine

from .conftest import METRICS_DIR

RULE_FILES = sorted((METRICS_DIR / "rules").glob("*.yml"))
TEST_FILES = sorted((METRICS_DIR / "tests").glob("*.yml"))


def _promtool(promtool: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool, *args], cwd=METRICS_DIR, capture_output=True, text=True, check=False
    )


def _alerts() -> set[str]:
    return {
        rule["alert"]
        for path in RULE_FILES
        for group in yaml.safe_load(path.read_text())["groups"]
        for rule in group["rules"]
        if "alert" in rule
    }


def _alert_cases() -> list[tuple[str, bool]]:
    """(alertname, expects-firing) for every alert_rule_test in metrics/tests."""
    cases = []
    for path in TEST_FILES:
        for test in yaml.safe_load(path.read_text())["tests"]:
            for case in test.get("alert_rule_test", []):
                cases.append((case["alertname"], bool(case.get("exp_alerts"))))
    return cases


def test_rule_and_test_files_exist() -> None:
    """metrics/ holds at least one rule file and one promtool test file."""
    assert RULE_FILES
    assert TEST_FILES


def test_promtool_check_config(promtool: str) -> None:
    """metrics/prometheus.yml (with its rule_files) is a valid Prometheus config."""
    result = _promtool(promtool, "check", "config", "prometheus.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{len(RULE_FILES)} rule files found" in result.stdout


def test_promtool_check_rules(promtool: str) -> None:
    """Every rule file passes promtool check rules."""
    result = _promtool(promtool, "check", "rules", *map(str, RULE_FILES))
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_test_rules(promtool: str) -> None:
    """Every promtool unit test in metrics/tests passes."""
    result = _promtool(promtool, "test", "rules", *map(str, TEST_FILES))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("alert", sorted(_alerts()))
def test_every_alert_has_a_firing_and_a_non_firing_unit_test(alert: str) -> None:
    """Each alert is exercised by promtool both firing and staying silent."""
    cases = _alert_cases()
    assert (alert, True) in cases, f"{alert} has no firing test"
    assert (alert, False) in cases, f"{alert} has no non-firing test"


def test_every_alert_has_severity_summary_and_description() -> None:
    """Alerts carry what routing and the on-call need."""
    for path in RULE_FILES:
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                if "alert" in rule:
                    assert rule["labels"]["severity"] in {"critical", "warning", "info"}
                    assert rule["annotations"]["summary"]
                    assert rule["annotations"]["description"]


def test_the_docs_describe_every_alert() -> None:
    """docs/observability.md has a section for each alert."""
    docs = (METRICS_DIR.parent / "docs" / "observability.md").read_text()
    missing = [alert for alert in _alerts() if alert not in docs]
    assert not missing


def _stuck_case(state: str, leaving: str) -> dict[str, object]:
    labels = 'job="substrate-gpu-agent", instance="agent:9477"'
    return {
        "name": f"an actor in {state} with no exit for 10 minutes fires",
        "interval": "1m",
        "input_series": [
            {
                "series": f'substrate_gpu_actors{{{labels}, state="{state}", in_flight="true"}}',
                "values": "1x30",
            },
            {
                "series": f"substrate_gpu_actor_transitions_total{{{labels}, "
                f'from="{state}", to="failed", trigger="{leaving}"}}',
                "values": "0x30",
            },
        ],
        "alert_rule_test": [
            {
                "eval_time": "12m",
                "alertname": "SubstrateGpuActorsStuckInTransition",
                "exp_alerts": [
                    {
                        "exp_labels": {
                            "severity": "warning",
                            "job": "substrate-gpu-agent",
                            "instance": "agent:9477",
                            "state": state,
                        },
                        "exp_annotations": {
                            "summary": f"1 actor(s) stuck in state {state} on agent:9477",
                            "description": (
                                f"No actor has left state {state} for 10 minutes while some "
                                "are in it: an effect (runsc, injection, probe) is hung or its "
                                "timeout is too long."
                            ),
                        },
                    }
                ],
            }
        ],
    }


def test_the_stuck_actor_alert_fires_for_every_in_flight_state_of_the_machine(
    promtool: str, tmp_path: Path
) -> None:
    """Generated from machines/actor.yaml: an actor sitting in ANY state that runs an effect
    (cuda_suspending, cuda_resuming and deleting included) fires the stuck-actor alert."""
    spec = machine.load_spec()
    cases = [_stuck_case(state, "effect_timed_out") for state in sorted(spec.in_flight_states)]
    tests = tmp_path / "stuck_test.yml"
    tests.write_text(
        yaml.safe_dump(
            {
                "rule_files": [str(METRICS_DIR / "rules" / "substrate-gpu.yml")],
                "evaluation_interval": "1m",
                "tests": cases,
            }
        )
    )
    result = _promtool(promtool, "test", "rules", str(tests))
    assert result.returncode == 0, result.stdout + result.stderr
