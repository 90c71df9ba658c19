"""The ``substrate-gpu`` command line.

Each subsystem owns one module here (``_inject``, ``_cdi``, ``_pool``, …) exposing
``register(subparsers)``; this module only assembles them and maps errors to exit codes.

Exit codes (documented in the README):

- 0: success (also when the reader of the output left early: `… | head`)
- 1: the operation failed (a :class:`~substrate_gpu.exceptions.SubstrateGpuError`): the
  message says what and where; nothing was half-written
- 2: the command line itself is wrong (argparse; the usage printed is the typed command's)
- 3: validation found problems in the input (``pool validate``, ``pool render``)
- 130: interrupted (Ctrl-C); 143: ``demo`` stopped by SIGTERM, cleaned up as after Ctrl-C

Error messages are worded in one place, :mod:`._errors`.
"""

from __future__ import annotations

import argparse
import functools
import os
import select
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

from substrate_gpu import _log, exceptions
from substrate_gpu.cli import _deferred, _errors, _registry
from substrate_gpu.cli._exitcodes import EXIT_FAILED, EXIT_INVALID, EXIT_OK, EXIT_USAGE

__all__ = [
    "EXIT_FAILED",
    "EXIT_INVALID",
    "EXIT_OK",
    "EXIT_USAGE",
    "Handler",
    "build_parser",
    "main",
]

#: A subcommand's entry point: parsed arguments in, exit code out.
Handler = Callable[[argparse.Namespace], int]


_LOG_FORMAT = "--log-format"
_LOG_LEVEL = "--log-level"
_GLOBAL = frozenset({_LOG_FORMAT, _LOG_LEVEL})
"""The options of ``substrate-gpu`` itself, which go before the command."""

if TYPE_CHECKING:
    _SubParsersAction = argparse._SubParsersAction[argparse.ArgumentParser]
else:  # not subscriptable at runtime
    _SubParsersAction = argparse._SubParsersAction


class _SubcommandAction(_SubParsersAction):
    """Runs the chosen subcommand's parser; unknown arguments are that parser's mistake.

    argparse hands a subcommand's unknown arguments up to the top-level parser, which then
    prints the top level's usage; the user needs the usage of the command they were typing.
    """

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        chosen = self.choices.get(values[0]) if values else None
        if chosen is not None:
            _deferred.add_pending_arguments(chosen)
        attr = argparse._UNRECOGNIZED_ARGS_ATTR
        before = len(getattr(namespace, attr, ()))
        super().__call__(parser, namespace, values, option_string)
        unknown: list[str] = getattr(namespace, attr, [])[before:]
        if unknown and values:
            message = f"unrecognized arguments: {' '.join(unknown)}"
            misplaced = [a.split("=", 1)[0] for a in unknown if a.split("=", 1)[0] in _GLOBAL]
            if misplaced:
                what = "is an option" if len(misplaced) == 1 else "are options"
                message += (
                    f" ({', '.join(misplaced)} {what} of substrate-gpu itself: "
                    "give it before the command)"
                )
            self.choices[values[0]].error(message)


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose subcommands (at every depth) report their own mistakes."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Subparsers are built with the parent's class, so every level gets the action.
        self.register("action", "parsers", _SubcommandAction)

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        """A choice one typo away from a valid one (``agnet``) is named: did you mean it?

        argparse names the nearest choice itself only from Python 3.14 (``suggest_on_error``).
        """
        choices = action.choices
        if choices is not None and isinstance(value, str) and value not in choices:
            import difflib  # noqa: PLC0415 - only on a mistake

            close = difflib.get_close_matches(value, [str(c) for c in choices], n=1)
            if close:
                listed = ", ".join(repr(str(c)) for c in choices)
                raise argparse.ArgumentError(
                    action,
                    f"invalid choice: {value!r} (did you mean {close[0]!r}? choose from {listed})",
                )
        super()._check_value(action, value)


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser, with every subsystem's subcommands."""
    parser = _Parser(
        prog="substrate-gpu",
        description="NVIDIA GPUs for gVisor-sandboxed actors.",
    )
    parser.add_argument(
        _LOG_FORMAT,
        choices=["auto", "json", "console"],
        default="auto",
        help="log format on stderr (auto: console on a terminal, JSON lines otherwise)",
    )
    parser.add_argument(
        _LOG_LEVEL,
        default=None,
        type=str.upper,
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="least severe level logged (default: WARNING; agent, controller: INFO; demo: ERROR)",
    )
    subparsers = cast(
        "_SubParsersAction",
        parser.add_subparsers(dest="command", required=True, metavar="COMMAND"),
    )
    for register in _registry.REGISTRARS:
        register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the process exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    json_logs = {"auto": None, "json": True, "console": False}[args.log_format]
    # A long-running agent announces where it serves; one-shot commands keep quiet.
    level = args.log_level or getattr(args, "default_log_level", "WARNING")
    handler: Handler = args.handler
    # structlog (with rich, when installed) is most of a one-shot command's start, so it is
    # configured, and imported, only when the command logs: `logs` is "on first log" for
    # most, "at start" for the long-running ones (whose libraries log through the stdlib
    # from the start) and "never" for those that never log.
    logs = getattr(args, "logs", "on first log")
    if logs != "never":
        configure = functools.partial(_configure_logging, json=json_logs, level=level)
        if logs == "at start":
            configure()
        else:
            _log.configure_on_first_log(configure, level=level)
    try:
        code = handler(args)
        sys.stdout.flush()  # here, so a reader gone by now is handled below
    except exceptions.SubstrateGpuError as e:
        print(f"substrate-gpu: error: {_errors.describe(e)}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        if not _stdout_reader_left():
            raise
        # `… | head`: the reader has what it wanted. Stop quietly, and point stdout at
        # /dev/null so the interpreter's final flush does not raise again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return EXIT_OK
    finally:
        _log.configure_on_first_log(None)  # this command's, not a later caller's
    return code


def _configure_logging(*, json: bool | None, level: str) -> None:
    from substrate_gpu.observability import logging as logging_  # noqa: PLC0415

    logging_.configure_logging(json=json, level=level)


def _stdout_reader_left() -> bool:
    """Whether stdout is a pipe whose reader has gone (a broken socket is another error)."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(mask & select.POLLERR for _, mask in poller.poll(0))
    except (OSError, ValueError):
        return False


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
