"""How the CLI words an error for a person: the one place CLI error text is composed.

Errors are raised deep down with "while doing X on Y: cause" messages, and an
``OSError`` cause often travels in them as Python's own text (``[Errno 2] No such file or
directory: '/p.yaml'``), or a layer that adds its context wraps one that already had it
("while generating the CDI spec: while generating the CDI spec with nvidia-ctk: …").
Rather than reword every raise site, every CLI error passes through :func:`describe`:

- an ``OSError`` anywhere in the ``__cause__`` chain is worded in lower-case words, and
  followed by what to do about it (``no such file or directory; check the path``);
- adjacent "while" contexts are folded: a refinement replaces its outer context, two
  distinct ones read "while X (Y): …".
"""

from __future__ import annotations

import errno
import re
from typing import Final

__all__ = ["describe"]

_WHAT_TO_DO: Final[dict[int, str]] = {
    errno.ENOENT: "check the path",
    errno.ENOTDIR: "check the path",
    errno.EISDIR: "give a file",
    errno.EACCES: "run as a user who may access it (root?)",
    errno.EPERM: "run as a user who may access it (root?)",
    errno.EROFS: "choose a writable location",
    errno.ENOSPC: "free some space",
    errno.ELOOP: "check the path's symbolic links",
}
"""What a person can do about an OS error, by errno; others are worded without advice."""

_NESTED_WHILE: Final = re.compile(r"while ([^:]+): while ([^:]+):")


def _os_errors(error: BaseException) -> list[OSError]:
    """The ``OSError`` causes of ``error`` (explicit ``from e`` chains), outermost first."""
    found: list[OSError] = []
    seen: set[int] = set()
    cause = error.__cause__
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, OSError):
            found.append(cause)
        cause = cause.__cause__
    return found


def _worded(error: OSError) -> str:
    words = error.strerror or str(error)
    return words[:1].lower() + words[1:]


def _fold_contexts(message: str) -> str:
    def fold(match: re.Match[str]) -> str:
        outer, inner = match.group(1), match.group(2)
        if inner.startswith(outer):  # the inner context says the same, more precisely
            return f"while {inner}:"
        return f"while {outer} ({inner}):"

    while True:
        folded = _NESTED_WHILE.sub(fold, message, count=1)
        if folded == message:
            return message
        message = folded


def describe(error: BaseException) -> str:
    """``error``'s message as the CLI prints it (see the module docstring)."""
    message = str(error)
    for cause in _os_errors(error):
        worded = _worded(cause)
        hint = _WHAT_TO_DO.get(cause.errno or 0)
        raw = str(cause)
        if raw in message:
            rest = message.replace(raw, "")
            named = [str(f) for f in (cause.filename, cause.filename2) if f is not None]
            if any(name not in rest for name in named):  # keep paths only the cause named
                worded = f"{worded} ({' -> '.join(named)})"
            message = message.replace(raw, f"{worded}; {hint}" if hint else worded)
        elif cause.strerror and message.endswith(cause.strerror):
            message = message[: -len(cause.strerror)] + (f"{worded}; {hint}" if hint else worded)
        elif hint and hint not in message:
            message = f"{message}; {hint}"
    return _fold_contexts(message)
