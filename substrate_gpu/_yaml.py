"""YAML reading with libyaml's C loader when PyYAML has it (several times faster than the
pure-Python one; the same documents, the same safe subset)."""

from __future__ import annotations

import yaml

try:
    from yaml import CSafeLoader as SafeLoader
except ImportError:  # pragma: no cover - PyYAML built without libyaml
    from yaml import SafeLoader  # type: ignore[assignment]

__all__ = ["SafeLoader", "safe_load"]


def safe_load(text: str | bytes) -> object:
    """``yaml.safe_load``, through :data:`SafeLoader`."""
    return yaml.load(text, Loader=SafeLoader)
