"""The controller's log: one line per reconcile action, at INFO (its default level)."""

from __future__ import annotations

import argparse

import pytest
from pools.pool_cases import flat, pool
from structlog.testing import capture_logs

from substrate_gpu.cli import _controller
from substrate_gpu.controller import operator, reconcile
from substrate_gpu.pools import ControllerSettings

SETTINGS = ControllerSettings(default_image="ateom:1")


def _plan(settings: ControllerSettings = SETTINGS, *, cpu: bool = False) -> reconcile.Plan:
    doc = pool(
        {"replicas": 2, "template": {"resources": {"requests": {"cpu": "1"}}}} if cpu else flat("1")
    )
    body = doc | {"metadata": doc["metadata"] | {"namespace": "ns", "uid": "u", "generation": 1}}
    return reconcile.plan(body, settings)


@pytest.mark.parametrize(
    ("cause", "event"),
    [
        pytest.param("create", "workerpool created", id="create"),
        pytest.param("update", "workerpool updated", id="update"),
        pytest.param("resume", "workerpool resumed", id="resume"),
    ],
)
def test_an_applied_pool_logs_what_was_done_to_its_deployment(cause: str, event: str) -> None:
    """Created, updated or (after a restart) resumed: INFO, with the Deployment named."""
    with capture_logs() as logs:
        operator.log_reconciled("ns/p", cause, _plan())
    [line] = logs
    assert (line["event"], line["log_level"], line["pool"]) == (event, "info", "ns/p")
    assert line["deployment"].endswith("-workers")


def test_a_rejected_pool_logs_the_reason_and_message() -> None:
    """Rejected: the reason and what to do, visible at the default level."""
    outcome = _plan(ControllerSettings(), cpu=True)  # no built-in image for a CPU pool
    assert isinstance(outcome, reconcile.Reject)
    with capture_logs() as logs:
        operator.log_reconciled("ns/p", "create", outcome)
    [line] = logs
    assert (line["event"], line["reason"]) == ("workerpool rejected", "NoWorkerImage")
    assert "ATE_DEFAULT_WORKER_IMAGE" in line["message"]


def test_an_applied_pool_logs_each_warning() -> None:
    """A deprecated ateomImage is applied, and said (WARNING) in the controller's log."""
    doc = pool(flat("1", ateomImage="ateom:1"))
    body = doc | {"metadata": doc["metadata"] | {"namespace": "ns", "uid": "u", "generation": 1}}
    with capture_logs() as logs:
        operator.log_reconciled("ns/p", "create", reconcile.plan(body, SETTINGS))
    [_, warning] = logs
    assert (warning["event"], warning["log_level"]) == ("workerpool warning", "warning")
    assert warning["warning"].startswith("spec.ateomImage: is deprecated")


def test_the_controller_logs_at_info_by_default() -> None:
    """Without --log-level, ``controller`` logs INFO (the CLI's default is WARNING)."""
    parser = argparse.ArgumentParser()
    _controller.register(parser.add_subparsers())
    assert parser.parse_args(["controller"]).default_log_level == "INFO"
