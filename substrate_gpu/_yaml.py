"""YAML through libyaml's C loader and emitter when PyYAML has them (several times faster
than the pure-Python ones; the same documents, the same safe subset, the same bytes out)."""

from __future__ import annotations

import yaml

try:
    from yaml import CSafeDumper as SafeDumper
    from yaml import CSafeLoader as SafeLoader
except ImportError:  # pragma: no cover - PyYAML built without libyaml
    from yaml import SafeDumper, SafeLoader  # type: ignore[assignment]

__all__ = ["SafeDumper", "SafeLoader", "safe_load"]


def safe_load(text: str | bytes) -> object:
    """``yaml.safe_load``, through :data:`SafeLoader`."""
    return yaml.load(text, Loader=SafeLoader)
