"""metrics/: the scrape config and rule files pass promtool, and every alert is unit-tested."""

from __future__ import annotations

import subprocess

import pytest
import yaml

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
