"""Subcommand arguments added only when that subcommand is typed.

A subcommand whose defaults come from the agent stack (``agent``: the service's limits, the
metrics port, the toolkit's paths) would otherwise load that stack for every command, even
``--help``: the parser of every subcommand is built before any is chosen.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

__all__ = ["Builder", "add_pending_arguments", "defer_arguments"]

#: Adds a subcommand's arguments to its parser.
Builder = Callable[[argparse.ArgumentParser], None]

_PENDING = "_substrate_gpu_pending_arguments"


def defer_arguments(parser: argparse.ArgumentParser, build: Builder) -> None:
    """Have ``build(parser)`` run when ``parser``'s subcommand is chosen, before it parses."""
    setattr(parser, _PENDING, build)


def add_pending_arguments(parser: argparse.ArgumentParser) -> None:
    """Run the builder :func:`defer_arguments` left on ``parser``, once."""
    build: Builder | None = getattr(parser, _PENDING, None)
    if build is not None:
        delattr(parser, _PENDING)
        build(parser)
