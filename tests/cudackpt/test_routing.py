"""Choosing the GPU suspend route: a table of runsc features, tool availability and policy."""

from __future__ import annotations

import pytest

from substrate_gpu.cudackpt import routing
from substrate_gpu.runsc import api


def features(*, cuda_checkpoint_path: bool) -> api.RunscFeatures:
    return api.RunscFeatures(
        version="runsc version release-20250512.0",
        leave_running=True,
        cuda_checkpoint_path=cuda_checkpoint_path,
        nvproxy_driver_version=True,
        list_supported_drivers=True,
    )


@pytest.mark.parametrize(
    ("runsc_path", "in_sandbox", "policy", "route"),
    [
        # runsc driving cuda-checkpoint itself is preferred: one command, its own pids.
        pytest.param(True, True, "auto", "runsc-cuda-checkpoint", id="runsc-path-wins"),
        pytest.param(True, False, "auto", "runsc-cuda-checkpoint", id="runsc-path-only"),
        pytest.param(False, True, "auto", "exec-cuda-checkpoint", id="exec-only"),
        pytest.param(False, False, "auto", "refuse", id="neither"),
        # The pool's policy overrides what is available.
        pytest.param(True, True, "refuse", "refuse", id="policy-refuse-with-runsc-path"),
        pytest.param(False, True, "refuse", "refuse", id="policy-refuse-with-exec"),
    ],
)
def test_choose_suspend_route(runsc_path, in_sandbox, policy, route) -> None:
    """The route follows features, availability and the pool's policy."""
    chosen = routing.choose_suspend_route(
        features(cuda_checkpoint_path=runsc_path), in_sandbox, policy
    )
    assert chosen.name == route
    assert chosen.refuses == (route == "refuse")
    assert chosen.reason


def test_refusal_reason_names_what_is_missing() -> None:
    """Refusing for lack of a route says what is missing."""
    chosen = routing.choose_suspend_route(features(cuda_checkpoint_path=False), False)
    assert "cuda-checkpoint-path" in chosen.reason
    assert "not available inside the sandbox" in chosen.reason


def test_unknown_policy_is_an_error() -> None:
    """A policy outside auto|refuse is a ValueError naming the choices."""
    with pytest.raises(ValueError, match="auto"):
        routing.choose_suspend_route(features(cuda_checkpoint_path=True), True, "sometimes")  # type: ignore[arg-type]
