"""The YAML side of :mod:`substrate_gpu.cdi.parse`: the safe loader with its refusals.

Its own module so that a JSON spec (the common case: the agent has nvidia-ctk write JSON)
never imports PyYAML; :mod:`.parse` imports this only for a document that is not JSON.
"""

from __future__ import annotations

from collections.abc import Hashable

import yaml

from substrate_gpu import _yaml

__all__ = ["SpecLoader", "describe_error"]


class SpecLoader(_yaml.SafeLoader):
    """The safe loader, refusing what a generated CDI spec never contains (:mod:`.parse`)."""

    def construct_object(self, node: yaml.Node, deep: bool = False) -> object:
        # A node constructed twice is an alias (``*name``) or a recursive reference.
        if node in self.constructed_objects:
            raise yaml.constructor.ConstructorError(
                None,
                None,
                "YAML aliases are not allowed in a CDI spec (a node anchored here is reused)",
                node.start_mark,
            )
        return super().construct_object(node, deep=deep)

    def construct_mapping(
        self,
        node: yaml.MappingNode,
        deep: bool = False,
    ) -> dict[Hashable, object]:
        # No flatten_mapping(): merge keys (``<<``) then fail for want of a constructor.
        mapping: dict[Hashable, object] = {}
        for key_node, value_node in node.value:
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, str):
                raise yaml.constructor.ConstructorError(
                    "while reading a mapping",
                    node.start_mark,
                    f"found a non-string key ({type(key).__name__})",
                    key_node.start_mark,
                )
            if key in mapping:
                raise yaml.constructor.ConstructorError(
                    "while reading a mapping",
                    node.start_mark,
                    f"found duplicate key {key!r}",
                    key_node.start_mark,
                )
            mapping[key] = self.construct_object(value_node, deep=deep)
        return mapping


def describe_error(error: yaml.YAMLError) -> str:
    """The error's message, with its line and column when it has them."""
    if isinstance(error, yaml.MarkedYAMLError) and error.problem_mark is not None:
        mark = error.problem_mark
        what = ": ".join(part for part in (error.context, error.problem) if part)
        return f"not valid YAML: {what} at line {mark.line + 1}, column {mark.column + 1}"
    return f"not valid YAML: {error}"
