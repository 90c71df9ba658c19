"""The decision and its reason for each hook newer toolkits write, in the plan and the log."""

from __future__ import annotations

from pathlib import Path

import pytest
import structlog
from structlog.testing import capture_logs
from support.gpu_nodes import injection_options

from substrate_gpu.cdi import model
from substrate_gpu.injection import bundle as bundle_
from substrate_gpu.injection import hooks
from substrate_gpu.rootfs import SonameCache
from substrate_gpu.testing import bundles


def toolkit_hook(*args: str) -> model.Hook:
    return model.Hook(
        hook_name="createContainer",
        path="/usr/bin/nvidia-cdi-hook",
        args=("nvidia-cdi-hook", *args),
    )


@pytest.mark.parametrize(
    ("args", "verdict", "reason"),
    [
        pytest.param(
            ("create-symlinks", "--link", "a::b"), "keep", "allowlisted", id="create-symlinks"
        ),
        pytest.param(
            ("enable-cuda-compat", "--host-driver-version=1"),
            "keep",
            "allowlisted",
            id="enable-cuda-compat",
        ),
        pytest.param(
            ("update-ldcache", "--folder", "/x"),
            "skip",
            "SONAME links are staged instead",
            id="update-ldcache",
        ),
        # runsc emulates ModifyDeviceFiles=0 itself and skips this hook.
        pytest.param(
            ("disable-device-node-modification",),
            "skip",
            "runsc emulates ModifyDeviceFiles=0",
            id="disable-device-node-modification",
        ),
        pytest.param(
            ("update-application-profile",),
            "skip",
            "application profile into the untrusted rootfs",
            id="update-application-profile",
        ),
        pytest.param(
            ("chmod", "--mode", "755", "--path", "/dev/nvidia-caps"),
            "skip",
            "deprecated",
            id="chmod",
        ),
        # Toolkit 1.20+: NVIDIA_GPU_MEMORY_REQUEST/LIMIT through the host's NVML.
        pytest.param(
            ("apply-cuda-memory-limits", "--gpu-id", "GPU-1", "--driver-root", "/"),
            "skip",
            "NVIDIA_GPU_MEMORY_REQUEST/LIMIT",
            id="apply-cuda-memory-limits",
        ),
        pytest.param(
            ("check-requirements", "--driver-root", "/"),
            "skip",
            "NVIDIA_REQUIRE_*",
            id="check-requirements",
        ),
        pytest.param(
            ("create-soname-symlinks", "--folder", "/x"),
            "skip",
            "SONAME links are staged instead",
            id="create-soname-symlinks",
        ),
        pytest.param(
            ("update-nvidia-params",),
            "skip",
            "development name of disable-device-node-modification",
            id="update-nvidia-params",
        ),
        pytest.param(
            ("some-future-hook",),
            "skip",
            "not in the hook allowlist (unreviewed)",
            id="unknown-subcommand",
        ),
    ],
)
def test_each_toolkit_hook_has_a_decision_and_a_reason(args, verdict, reason):
    """Every hook a toolkit writes gets keep/skip with a specific reason."""
    decision = hooks.classify_hook(toolkit_hook(*args))
    assert decision.verdict == verdict
    assert reason in decision.reason


def test_skip_log_lines_carry_the_reason(node_edits, gpu_node, tmp_path, monkeypatch):
    """Injecting the 1.20 spec logs one cdi_hook_skipped line per skipped hook, with its reason."""
    bundle = bundles.make_bundle(tmp_path / "bundle", ["true"])
    with capture_logs() as logs:
        # A fresh logger: the module's may be cached by an earlier test's configuration.
        monkeypatch.setattr(bundle_, "log", structlog.get_logger(bundle_.__name__))
        bundle_.inject_gpu(
            bundle,
            node_edits,
            options=injection_options(gpu_node),
            soname_cache=SonameCache(),
        )
    skipped = {e["hook"]: e["reason"] for e in logs if e["event"] == "cdi_hook_skipped"}
    assert skipped == {
        name: hooks.SKIP_REASONS[name]
        for name in (
            "update-ldcache",
            "disable-device-node-modification",
            "update-application-profile",
        )
    }


def test_hook_verdicts_are_said_once_and_each_injection_in_one_line(
    node_edits, gpu_node, tmp_path, monkeypatch
):
    """A worker's actors share its plan cache: the skipped hooks are logged at the first
    injection only; at INFO every injection is then exactly one line, ``gpu_injected``."""
    plans, sonames = bundle_.PlanCache(), SonameCache()
    with capture_logs() as logs:
        monkeypatch.setattr(bundle_, "log", structlog.get_logger(bundle_.__name__))
        for actor in ("a1", "a2", "a3"):
            bundle_.inject_gpu(
                bundles.make_bundle(tmp_path / actor, ["true"]),
                node_edits,
                options=injection_options(gpu_node),
                soname_cache=sonames,
                plan_cache=plans,
            )
    info = [e["event"] for e in logs if e["log_level"] == "info"]
    assert info == ["cdi_hook_skipped"] * 3 + ["gpu_injected"] * 3
    injected = [e for e in logs if e["event"] == "gpu_injected"]
    assert [e["hooks_skipped"] for e in injected] == [3, 3, 3]
    assert injected[0]["links_created"] > 0


# Every nvidia-cdi-hook subcommand of the toolkit's releases and main branch (late 2026:
# cmd/nvidia-cdi-hook/*, internal/discover/hooks.go); a new one gets a row here when reviewed.
TOOLKIT_HOOKS = (
    "apply-cuda-memory-limits",
    "check-requirements",
    "chmod",
    "create-soname-symlinks",
    "create-symlinks",
    "disable-device-node-modification",
    "enable-cuda-compat",
    "update-application-profile",
    "update-ldcache",
    "update-nvidia-params",
)


def test_every_toolkit_hook_is_decided_in_the_code_and_the_docs_table() -> None:
    """Each known hook is allowlisted or has a skip reason, and has its row in the docs."""
    decided = hooks.KEPT_SUBCOMMANDS | set(hooks.SKIP_REASONS)
    assert decided == set(TOOLKIT_HOOKS)
    table = (Path(__file__).resolve().parents[2] / "docs" / "gpu-injection.md").read_text()
    missing = [name for name in TOOLKIT_HOOKS if f"\n| `{name}` |" not in table]
    assert missing == []


def test_a_reviewed_hook_keeps_its_own_reason_at_another_hook_point():
    """apply-cuda-memory-limits is a createRuntime hook: its skip says why, not only where."""
    hook = model.Hook(
        hook_name="createRuntime",
        path="/usr/bin/nvidia-cdi-hook",
        args=("nvidia-cdi-hook", "apply-cuda-memory-limits", "--driver-root", "/", "--gpu-id", "G"),
    )
    decision = hooks.classify_hook(hook)
    assert (decision.verdict, decision.name) == ("skip", "apply-cuda-memory-limits")
    assert decision.reason == hooks.SKIP_REASONS["apply-cuda-memory-limits"]


def test_an_allowlisted_hook_at_another_hook_point_is_still_not_run():
    """create-symlinks registered at createRuntime is skipped for its hook point."""
    hook = model.Hook(
        hook_name="createRuntime", path="/h", args=("nvidia-cdi-hook", "create-symlinks")
    )
    assert hooks.classify_hook(hook).reason == "hook point createRuntime is not run"


def test_the_1_20_2_spec_plans_every_hook_and_keeps_the_new_mounts(sample_spec_1202):
    """The T4 spec of 1.20.2's shape: the memory hook skipped with its reason, the void mount
    and the R615 ucode firmware applied as plain read-only mounts (not libraries)."""
    from substrate_gpu import cdi
    from substrate_gpu.injection import oci

    edits = cdi.edits_for_all(sample_spec_1202)
    plan = oci.plan_injection(edits, (), driver_root="/", hook_binary="/opt/nvidia-toolkit/h")
    # Two spec-level link hooks and the `all` device's /dev/dri/by-path links.
    assert sorted(plan.hook_subcommands) == ["create-symlinks"] * 3 + ["enable-cuda-compat"]
    assert set(plan.skipped_hook_names) == {
        "apply-cuda-memory-limits",
        "update-ldcache",
        "disable-device-node-modification",
        "update-application-profile",
    }
    by_destination = {m.container_path: m for m in plan.mounts}
    void = by_destination["/var/run/nvidia-container-devices/void"]
    assert (void.host_path, void.options) == ("/dev/null", ("ro", "nosuid", "nodev", "bind"))
    assert "/lib/firmware/nvidia/615.71.09/ucodes_tu10x.bin" in by_destination
    assert not [lib for lib, _ in plan.libraries if "firmware" in str(lib)]
    assert "NVIDIA_VISIBLE_DEVICES=void" not in plan.env


@pytest.mark.parametrize(
    ("env", "warned"),
    [
        pytest.param(["NVIDIA_GPU_MEMORY_LIMIT=4096"], "NVIDIA_GPU_MEMORY_LIMIT", id="limit"),
        pytest.param(
            ["NVIDIA_GPU_MEMORY_REQUEST=1", "NVIDIA_GPU_MEMORY_LIMIT=2"],
            "NVIDIA_GPU_MEMORY_REQUEST,NVIDIA_GPU_MEMORY_LIMIT",
            id="both",
        ),
        pytest.param(["OTHER=1"], None, id="neither"),
    ],
)
def test_memory_limits_the_actor_asks_for_are_reported_unapplied(
    node_edits, gpu_node, tmp_path, monkeypatch, env, warned
):
    """An actor env asking for GPU memory limits gets a warning naming the variables, since
    the hook that would set them is skipped."""
    import dataclasses

    memory_hook = model.Hook(
        hook_name="createRuntime",
        path="/usr/bin/nvidia-cdi-hook",
        args=("nvidia-cdi-hook", "apply-cuda-memory-limits", "--driver-root", "/", "--gpu-id", "G"),
    )
    edits = dataclasses.replace(node_edits, hooks=(*node_edits.hooks, memory_hook))
    bundle = bundles.make_bundle(tmp_path / "bundle", ["true"], env=["PATH=/bin", *env])
    with capture_logs() as logs:
        monkeypatch.setattr(bundle_, "log", structlog.get_logger(bundle_.__name__))
        bundle_.inject_gpu(
            bundle, edits, options=injection_options(gpu_node), soname_cache=SonameCache()
        )
    warnings = [e for e in logs if e["event"] == "gpu_memory_limits_not_applied"]
    if warned is None:
        assert warnings == []
    else:
        assert [(w["log_level"], w["variables"]) for w in warnings] == [("warning", warned)]


def test_no_memory_warning_without_the_hook():
    """A spec of an older toolkit (no such hook) never claims the limits would be set."""
    assert hooks.unapplied_memory_limits(("update-ldcache",), ["NVIDIA_GPU_MEMORY_LIMIT=1"]) == ()
