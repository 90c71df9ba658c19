"""``substrate-gpu demo``: the README's main command (see :mod:`substrate_gpu.demo`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from substrate_gpu import demo
from substrate_gpu.cli._exitcodes import EXIT_OK


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``demo``."""
    parser = subparsers.add_parser(
        "demo", help="run a simulated GPU node end to end (real runc when root)"
    )
    parser.add_argument(
        "--workdir",
        type=Path,
        help="keep everything under this directory (default: a temporary one, removed)",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Handler of ``demo``."""
    demo.main(args.workdir, sys.stdout)
    return EXIT_OK
