"""structlog loggers that import structlog on their first log call, not at import.

``import structlog`` costs ~120 ms (it loads its console renderer, with rich when installed,
and asyncio): more than the rest of a one-shot ``substrate-gpu`` command such as ``inject``
or ``cdi show``, which usually logs nothing (tests/bench/bench_cli.py). The modules those
commands load take their logger from :func:`get_logger`; it is structlog's own logger, bound
the same way, once something is logged.

:func:`configure_on_first_log` is how such a command configures logging only when it logs:
the configuration runs just before the first record at or above its level is logged, and
never when none is. A record below that level (an injection's ``info`` lines, at the CLI's
default WARNING) is dropped here, as the configured filter would drop it.
"""

from __future__ import annotations

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
    """Stands in for ``structlog.get_logger(name).bind(**context)`` until it is used."""

    __slots__ = ("_context", "_logger", "_name")

    def __init__(self, name: str, context: dict[str, object]) -> None:
        self._name = name
        self._context = context
        self._logger: Any = None

    def bind(self, **context: object) -> _Logger:
        # Binding logs nothing: it stays lazy (an injection binds its bundle every time).
        return _Logger(self._name, {**self._context, **context})

    def __getattr__(self, attribute: str) -> Any:
        logger = self._logger
        if logger is None:
            pending = _pending
            if pending is not None and _METHOD_LEVELS.get(attribute, 100) < pending.level:
                return _dropped
            _configure_pending()
            import structlog  # noqa: PLC0415  (the point of this module)

            # Unbound, structlog's own lazy proxy: it follows a later structlog.configure
            # (tests capture logs that way) exactly as a module-level one would.
            logger = structlog.get_logger(self._name)
            if self._context:
                logger = logger.bind(**self._context)
            self._logger = logger
        return getattr(logger, attribute)


def _configure_pending() -> None:
    global _pending
    pending, _pending = _pending, None
    if pending is not None:
        pending.configure()


def get_logger(name: str) -> structlog.typing.FilteringBoundLogger:
    """``structlog.get_logger(name)``, imported when it first logs."""
    return cast("structlog.typing.FilteringBoundLogger", _Logger(name, {}))
