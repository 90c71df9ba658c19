"""The node agent's per-worker injector (the lifecycle's GPU injection effect)."""

from __future__ import annotations

import json

import pytest
from support.gpu_nodes import injection_options, toolkit_config

from substrate_gpu.exceptions import DeviceRequestError
from substrate_gpu.injection import bundle as bundle_
from substrate_gpu.injection import toolkit
from substrate_gpu.injection.injector import WorkerGpuInjector
from substrate_gpu.testing import bundles

pytestmark = pytest.mark.anyio


async def test_generates_once_and_injects_many_actors(gpu_node, tmp_path):
    """The spec is generated on first use; every actor gets the same devices."""
    generator = toolkit.CdiSpecGenerator(toolkit_config(gpu_node, tmp_path / "cdi"))
    injector = WorkerGpuInjector(
        generator=generator,
        options=injection_options(gpu_node),
    )
    counts = [
        await injector(bundles.make_bundle(tmp_path / f"actor{i}", ["true"])) for i in range(3)
    ]
    assert counts == [4, 4, 4]  # nvidia0 + nvidiactl + nvidia-uvm + nvidia-uvm-tools
    assert generator.cached is not None
    stats = injector.soname_cache.stats
    assert stats.misses == len(list(gpu_node.lib64.iterdir()))  # read once, then cached


def test_needs_exactly_one_spec_source(gpu_node):
    """A spec and a generator together (or neither) is a programming error."""
    with pytest.raises(ValueError, match="exactly one"):
        WorkerGpuInjector(options=bundle_.InjectionOptions())


async def test_skipped_hooks_are_counted_by_name(gpu_node, tmp_path):
    """Every hook left out of an injected bundle is counted under its bounded name."""
    from prometheus_client import CollectorRegistry

    from substrate_gpu.observability.metrics import AgentMetrics

    registry = CollectorRegistry()
    injector = WorkerGpuInjector(
        generator=toolkit.CdiSpecGenerator(toolkit_config(gpu_node, tmp_path / "cdi")),
        options=injection_options(gpu_node),
        metrics=AgentMetrics(registry),
    )
    bundle = bundles.make_bundle(tmp_path / "actor", ["true"])
    await injector(bundle)
    await injector(bundle)  # already injected: nothing skipped again

    def skipped(hook: str) -> float:
        return (
            registry.get_sample_value("substrate_gpu_injection_hooks_skipped_total", {"hook": hook})
            or 0.0
        )

    assert skipped("update-ldcache") == 1.0
    assert skipped("disable-device-node-modification") == 1.0
    assert skipped("update-application-profile") == 1.0


def claim_spec(name: str) -> str:
    """A DRA-driver-style per-claim spec granting /dev/nvidia0 under a claim name."""
    return json.dumps(
        {
            "cdiVersion": "0.5.0",
            "kind": "k8s.gpu.nvidia.com/claim",
            "devices": [
                {"name": name, "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0"}]}}
            ],
        }
    )


@pytest.fixture
def dra_injector(gpu_node, tmp_path):
    """An injector whose spec dirs receive per-claim specs while it runs."""
    spec_dir = tmp_path / "run-cdi"
    spec_dir.mkdir()
    injector = WorkerGpuInjector(
        generator=toolkit.CdiSpecGenerator(toolkit_config(gpu_node, tmp_path / "cdi")),
        options=injection_options(gpu_node),
        spec_dirs=[spec_dir],
    )
    return injector, spec_dir


async def test_a_claim_spec_written_later_is_found(dra_injector, tmp_path):
    """A DRA claim's spec appearing in the CDI dir after start is resolved on the next request."""
    injector, spec_dir = dra_injector
    bundle = bundles.make_bundle(tmp_path / "actor", ["true"])
    with pytest.raises(DeviceRequestError, match="no spec defines kind k8s.gpu.nvidia.com/claim"):
        await injector.inject(bundle, devices=["k8s.gpu.nvidia.com/claim=abc-gpu-0"])
    (spec_dir / "claim-abc.json").write_text(claim_spec("abc-gpu-0"))
    report = await injector.inject(bundle, devices=["k8s.gpu.nvidia.com/claim=abc-gpu-0"])
    assert report.outcome == "injected"
    assert [d.path for d in report.devices] == ["/dev/nvidia0"]


async def test_named_edits_are_reused_while_the_specs_are_unchanged(dra_injector):
    """The same request against unchanged spec files resolves once."""
    injector, spec_dir = dra_injector
    (spec_dir / "claim-abc.json").write_text(claim_spec("abc-gpu-0"))
    first = await injector.edits_for(["nvidia.com/gpu=0", "k8s.gpu.nvidia.com/claim=abc-gpu-0"])
    again = await injector.edits_for(["nvidia.com/gpu=0", "k8s.gpu.nvidia.com/claim=abc-gpu-0"])
    assert again is first
