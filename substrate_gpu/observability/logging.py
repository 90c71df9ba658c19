"""Structured logs: structlog and the standard library through one set of processors.

Design decisions:

- **One pipeline.** structlog loggers hand their event dicts to the standard library
  (``structlog.stdlib.LoggerFactory``), and one handler on the root logger renders every
  record with :class:`structlog.stdlib.ProcessorFormatter`. Records from stdlib loggers
  (``transitions``, ``anyio``, ``asyncio``) go through the same ``foreign_pre_chain``, so
  every line has the same shape: ``timestamp``, ``level``, ``logger``, ``event`` (the
  message), plus the bound context.
- **JSON lines in production, a console renderer on a TTY** (``json=None`` picks by whether
  the stream is a terminal).
- **Context through contextvars.** :func:`bind_actor` binds ``actor_id`` and ``event_type``
  (the lifecycle event being handled) for everything logged inside it, in this task only.
  ``event`` itself is structlog's message key, hence ``event_type``.
- **Tracebacks without local variables.** structlog's dict tracebacks include every frame's
  locals by default; a frame that holds a token or a key would write it to the log (brief
  §8). Both renderers here are built with locals off.
- The ``transitions`` logger is set to WARNING: it logs every trigger at INFO.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Final, TextIO

import structlog
from structlog.typing import Processor

__all__ = ["bind_actor", "configure_logging"]

_QUIET_LOGGERS: Final = {"transitions": logging.WARNING}


class _SubstrateGpuHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Marks the handler :func:`configure_logging` installs, so a second call replaces it."""


def _shared_processors() -> list[Processor]:
    """Processors every record goes through, structlog's and the stdlib's alike."""
    return [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.stdlib.PositionalArgumentsFormatter(),
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.StackInfoRenderer(),
    ]


def _renderer(*, json: bool, colors: bool) -> list[Processor]:
    if json:
        return [
            structlog.processors.ExceptionRenderer(
                structlog.tracebacks.ExceptionDictTransformer(show_locals=False)
            ),
            structlog.processors.UnicodeDecoder(),
            structlog.processors.JSONRenderer(),
        ]
    # plain_traceback never prints locals (rich's formatter would, by default).
    return [
        structlog.dev.ConsoleRenderer(
            colors=colors, exception_formatter=structlog.dev.plain_traceback
        )
    ]


def configure_logging(
    *,
    json: bool | None = None,
    level: int | str = logging.INFO,
    stream: TextIO | None = None,
) -> None:
    """Route structlog and stdlib logging to ``stream`` (default stderr), one shape for both.

    ``json=None`` chooses JSON lines unless ``stream`` is a terminal. Calling it again
    replaces the previous configuration (tests do; so may an agent reading new flags).
    """
    stream = stream if stream is not None else sys.stderr
    tty = bool(getattr(stream, "isatty", lambda: False)())
    use_json = (not tty) if json is None else json
    shared = _shared_processors()

    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=shared,
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            *_renderer(json=use_json, colors=tty),
        ],
    )
    handler = _SubstrateGpuHandler(stream)
    handler.setFormatter(formatter)

    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _SubstrateGpuHandler)]:
        root.removeHandler(old)
        old.close()
    root.addHandler(handler)
    root.setLevel(level)
    for name, quiet_level in _QUIET_LOGGERS.items():
        logging.getLogger(name).setLevel(quiet_level)

    structlog.configure(
        processors=[
            structlog.stdlib.filter_by_level,
            *shared,
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        # Safe to cache: rendering and levels live in the stdlib handler, which a later
        # call replaces; the structlog side is the same on every call.
        cache_logger_on_first_use=True,
    )


@contextmanager
def bind_actor(actor_id: str, event: str | None = None) -> Iterator[None]:
    """Bind ``actor_id`` (and ``event_type=event`` when given) to every log line inside."""
    context = {"actor_id": actor_id}
    if event is not None:
        context["event_type"] = event
    with structlog.contextvars.bound_contextvars(**context):
        yield
