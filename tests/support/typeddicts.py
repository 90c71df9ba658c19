"""Checking a parsed JSON/YAML value against a TypedDict, field by field, at run time.

For the tests that hold our typed payloads (OCI config, CDI spec, WorkerPool) to real data:
required keys present, every declared key holding its declared type (recursively through
lists, ``dict[str, X]``, unions and nested TypedDicts). Keys a TypedDict does not declare are
reported only with ``closed=True`` (our own output must not invent fields; real documents
may carry fields we do not model).
"""

from __future__ import annotations

import types
import typing
from typing import Any, Union, get_args, get_origin, get_type_hints, is_typeddict


def problems(value: object, expected: Any, path: str = "$", *, closed: bool = False) -> list[str]:
    """Every way ``value`` departs from ``expected``, as ``path: what`` lines."""
    if is_typeddict(expected):
        if not isinstance(value, dict):
            return [f"{path}: expected an object ({expected.__name__}), got {type(value).__name__}"]
        hints = get_type_hints(expected)
        found = [
            f"{path}: missing {key!r}" for key in sorted(expected.__required_keys__ - value.keys())
        ]
        for key, item in value.items():
            if key in hints:
                found += problems(item, hints[key], f"{path}.{key}", closed=closed)
            elif closed:
                found.append(f"{path}: {key!r} is not a field of {expected.__name__}")
        return found
    origin = get_origin(expected)
    if origin in (Union, types.UnionType):
        options = get_args(expected)
        if any(not problems(value, option, path, closed=closed) for option in options):
            return []
        return [f"{path}: {value!r} matches none of {expected}"]
    if origin in (typing.Required, typing.NotRequired):
        return problems(value, get_args(expected)[0], path, closed=closed)
    if origin is list:
        if not isinstance(value, list):
            return [f"{path}: expected a list, got {type(value).__name__}"]
        (item_type,) = get_args(expected)
        return [
            p
            for i, item in enumerate(value)
            for p in problems(item, item_type, f"{path}[{i}]", closed=closed)
        ]
    if origin is dict:
        if not isinstance(value, dict):
            return [f"{path}: expected a mapping, got {type(value).__name__}"]
        key_type, item_type = get_args(expected)
        return [
            p
            for key, item in value.items()
            for p in [
                *problems(key, key_type, f"{path}<key>"),
                *problems(item, item_type, f"{path}.{key}", closed=closed),
            ]
        ]
    if expected is object:
        return []
    if expected is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif expected is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
    else:
        ok = isinstance(value, expected)
    return [] if ok else [f"{path}: expected {expected.__name__}, got {value!r}"]


def declared_tree(expected: Any) -> dict[str, Any]:
    """``{field: subtree}`` of a TypedDict, descending into nested TypedDicts (and their
    lists); a leaf field maps to ``None``."""
    tree: dict[str, Any] = {}
    for key, declared in get_type_hints(expected).items():
        inner = declared
        while get_origin(inner) in (list, typing.Required, typing.NotRequired):
            inner = get_args(inner)[0]
        tree[key] = declared_tree(inner) if is_typeddict(inner) else None
    return tree
