"""Shared fixtures of the CDI parser tests: the real sample specs under tests/data/cdi."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

DATA = Path(__file__).resolve().parent.parent / "data" / "cdi"

#: The Go-template placeholders of NVIDIA's golden fixtures, and what the tests put there
#: (``{{ .gpuID }}``, toolkit 1.20.1+: the mock GPU's UUID, in apply-cuda-memory-limits).
PLACEHOLDERS = {
    "{{ .driverRoot }}": "/R",
    "{{ .toolkitRoot }}": "/T",
    "{{ .hostRoot }}": "/H",
    "{{ .gpuID }}": "GPU-00000000-0000-0000-0000-000000000000",
}


def substitute(text: str) -> str:
    """``text`` with the fixtures' Go-template placeholders replaced by absolute paths."""
    for placeholder, value in PLACEHOLDERS.items():
        text = text.replace(placeholder, value)
    return text


@pytest.fixture
def sample_text() -> Callable[[str], str]:
    """Read a sample (path relative to tests/data/cdi) with its placeholders substituted."""

    def read(relative: str) -> str:
        return substitute((DATA / relative).read_text(encoding="utf-8"))

    return read
