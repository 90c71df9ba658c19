"""Fixtures for injection tests: simulated GPU nodes, generated specs, actor bundles."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from support.gpu_nodes import generate_spec

from substrate_gpu import cdi
from substrate_gpu.testing import node as node_

if TYPE_CHECKING:
    from substrate_gpu.cdi import model


@pytest.fixture(scope="module")
def gpu_node(tmp_path_factory: pytest.TempPathFactory) -> node_.SimulatedNode:
    """A one-GPU simulated node (real char devices when root)."""
    return node_.build_node(tmp_path_factory.mktemp("node") / "root", gpus=(0,))


@pytest.fixture(scope="module")
def node_spec(
    gpu_node: node_.SimulatedNode, tmp_path_factory: pytest.TempPathFactory
) -> model.Spec:
    """The toolkit-1.20-shaped spec generated for ``gpu_node``."""
    return generate_spec(gpu_node, tmp_path_factory.mktemp("cdi"))


@pytest.fixture(scope="module")
def node_edits(node_spec: model.Spec) -> model.ContainerEdits:
    """Spec-level + ``all`` edits of ``node_spec``."""
    return cdi.edits_for_all(node_spec)


@pytest.fixture(scope="module")
def sample_spec_1202() -> model.Spec:
    """The real T4 spec brought to toolkit 1.20.2's shape (tests/data/cdi/PROVENANCE.md)."""
    from pathlib import Path

    path = (
        Path(__file__).resolve().parents[1]
        / "data/cdi/derived/DERIVED__kwx4957-T4__ctk-1.20.2-shape.yaml"
    )
    return cdi.load_spec(path)
