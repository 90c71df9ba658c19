"""The list of subcommand modules; each contributes ``register(subparsers)``."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from substrate_gpu.cli import _agent, _client, _controller, _demo, _inject, _pool, _replay

Registrar = Callable[["argparse._SubParsersAction[argparse.ArgumentParser]"], None]

REGISTRARS: list[Registrar] = [
    _agent.register,
    _controller.register,
    _client.register,
    _demo.register,
    _inject.register,
    _pool.register,
    _replay.register,
]
