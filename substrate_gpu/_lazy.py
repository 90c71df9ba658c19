"""A package's names resolved on first use (PEP 562), shared by the packages whose eager
imports would load the agent stack into every one-shot command."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping

__all__ = ["module_getattr"]


def module_getattr(
    package: str, lazy: Mapping[str, str], namespace: dict[str, object]
) -> Callable[[str], object]:
    """A module ``__getattr__`` for ``package``: a name of ``lazy`` is imported from the
    module it maps to on first use and kept in ``namespace`` (the package's globals)."""

    def __getattr__(name: str) -> object:
        try:
            module = lazy[name]
        except KeyError:
            raise AttributeError(f"module {package!r} has no attribute {name!r}") from None
        value: object = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    return __getattr__
