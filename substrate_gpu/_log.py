"""structlog loggers that import structlog on their first log call, not at import.

``import structlog`` is slow (it loads its console renderer, with rich when installed, and
asyncio): it costs more than the rest of a one-shot ``substrate-gpu`` command such as
``inject`` or ``cdi show``, which usually logs nothing (tests/bench/bench_cli.py; the figure:
tests/bench/README.md, "Figures behind design choices"). The modules those commands load
take their logger from :func:`get_logger`; it is structlog's own logger, bound the same way,
once something is logged.

:func:`configure_on_first_log` is how such a command configures logging only when it logs:
the configuration runs just before the first record at or above its level is logged, and
never when none is. A record below that level (an injection's ``info`` lines, at the CLI's
default WARNING) is dropped here, as the configured filter would drop it.

**A library writes nothing until configured** (the standard library's convention for
libraries). structlog left unconfigured prints every record to stdout, which an embedding
program (one answering on stdout, above all) cannot afford. So while structlog is not
configured — by :func:`substrate_gpu.observability.logging.configure_logging`, the CLI, or
the embedding program itself — records go to the standard library's ``substrate_gpu.*``
loggers instead, as one ``event key=value …`` message each, under a ``NullHandler``: nothing
is printed unless the program configures logging (``logging.basicConfig()`` shows them, in
its format). Once structlog is configured, every logger follows that configuration, from
its next record on.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, cast

if TYPE_CHECKING:
    import structlog

__all__ = ["configure_on_first_log", "get_logger"]

#: The stdlib's numbers for the logger methods that log at a fixed level.
_METHOD_LEVELS: Final = {
    "debug": 10,
    "info": 20,
    "warning": 30,
    "warn": 30,
    "error": 40,
    "exception": 40,
    "critical": 50,
    "fatal": 50,
}
_LEVELS: Final = {"DEBUG": 10, "INFO": 20, "WARNING": 30, "ERROR": 40, "CRITICAL": 50}


@dataclass(frozen=True)
class _Pending:
    configure: Callable[[], None]
    level: int


_pending: _Pending | None = None


def configure_on_first_log(configure: Callable[[], None] | None, *, level: str = "DEBUG") -> None:
    """Run ``configure`` before the first record at ``level`` or above that a
    :func:`get_logger` logger logs; drop those below it until then (``None``: forget a
    configuration not run yet)."""
    global _pending  # noqa: PLW0603  (one process-wide logging setup, as structlog's own)
    _pending = None if configure is None else _Pending(configure, _LEVELS[level.upper()])


def _dropped(*args: object, **kwargs: object) -> None:
    """A record below the pending configuration's level."""


class _Logger:
    """Stands in for ``structlog.get_logger(name).bind(**context)`` until it is used, and for
    a logger of the standard library's while structlog is not configured (module doc)."""

    __slots__ = ("_context", "_logger", "_name", "_stdlib")

    def __init__(self, name: str, context: dict[str, object]) -> None:
        self._name = name
        self._context = context
        self._logger: Any = None
        self._stdlib: Any = None

    def bind(self, **context: object) -> _Logger:
        # Binding logs nothing: it stays lazy (an injection binds its bundle every time).
        return _Logger(self._name, {**self._context, **context})

    def __getattr__(self, attribute: str) -> Any:
        # A pending configuration decides even for a logger bound before it was set (an
        # embedding program that runs the CLI again after structlog was configured once).
        pending = _pending
        if pending is not None:
            if _METHOD_LEVELS.get(attribute, 100) < pending.level:
                return _dropped
            _configure_pending()
        logger = self._logger
        import structlog  # noqa: PLC0415  (the point of this module; cached after the first)

        if not structlog.is_configured():
            return getattr(self._unconfigured(), attribute)
        if logger is None:
            # Unbound, structlog's own lazy proxy: it follows a later structlog.configure
            # (tests capture logs that way) exactly as a module-level one would.
            logger = structlog.get_logger(self._name)
            if self._context:
                logger = logger.bind(**self._context)
            self._logger = logger
        return getattr(logger, attribute)

    def _unconfigured(self) -> Any:
        """The standard library's logger of this name, through structlog's stdlib wrapper."""
        logger = self._stdlib
        if logger is None:
            import structlog  # noqa: PLC0415

            logger = structlog.wrap_logger(
                _stdlib_logger(self._name),
                processors=_unconfigured_processors(),
                wrapper_class=structlog.stdlib.BoundLogger,
            )
            if self._context:
                logger = logger.bind(**self._context)
            self._stdlib = logger
        return logger


def _configure_pending() -> None:
    global _pending
    pending, _pending = _pending, None
    if pending is not None:
        pending.configure()


_PACKAGE_LOGGER: Final = "substrate_gpu"


@functools.cache
def _null_handler_installed() -> None:
    """A ``NullHandler`` on the package's stdlib logger, once: what the standard library asks
    of a library, so no record reaches ``logging.lastResort`` (stderr) unconfigured."""
    import logging  # noqa: PLC0415

    package = logging.getLogger(_PACKAGE_LOGGER)
    if not any(isinstance(h, logging.NullHandler) for h in package.handlers):
        package.addHandler(logging.NullHandler())


def _stdlib_logger(name: str) -> Any:
    import logging  # noqa: PLC0415

    _null_handler_installed()
    return logging.getLogger(name)


def _logfmt_message(_logger: object, _method: str, event_dict: dict[str, Any]) -> str:
    """``event key=value …``: the record as one message for a stdlib handler's format."""
    event = str(event_dict.pop("event", ""))
    rest = " ".join(f"{key}={value!r}" for key, value in event_dict.items())
    return f"{event} {rest}" if rest else event


@functools.cache
def _unconfigured_processors() -> list[Any]:
    import structlog  # noqa: PLC0415

    return [
        structlog.stdlib.filter_by_level,  # cheap: nothing listens below the stdlib's level
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.PositionalArgumentsFormatter(),
        structlog.processors.format_exc_info,  # a plain traceback: no local variables
        _logfmt_message,
    ]


def get_logger(name: str) -> structlog.typing.FilteringBoundLogger:
    """``structlog.get_logger(name)``, imported when it first logs."""
    return cast("structlog.typing.FilteringBoundLogger", _Logger(name, {}))
