"""Classifying runsc's failures into the typed errors of :mod:`substrate_gpu.runsc.api`.

runsc reports everything as text on stderr (``util.Fatalf`` then exit 128), so the
lifecycle's decisions (refuse, retry, record, give up) hang on matching that text. The
patterns below are taken from gVisor's source, not guessed:

- ``can't save with live nvproxy clients`` — ``nvproxy.beforeSaveImpl`` panics with it when
  any nvproxy client is open; the state encoder reports it as ``… encoding error: …``.
  Builds without nvproxy save support panic earlier with ``nvproxy.frontendFD is not
  saveable`` (or ``uvmFD``) for any open device file: the same condition, a live handle.
- ``nvproxy: object handle <client>:<object> (class …, type …) is not restorable`` — newer
  releases can save clients, but not every driver object (``nvproxy.beforeSave``).
- ``cannot checkpoint container "<id>" in state stopped`` — ``Container.requireStatus``; the
  usual aftermath of a failed checkpoint without ``--leave-running``.
- ``unsupported Nvidia driver version: <v>`` — ``nvproxy.Init``/``Register``; a restore onto a
  different driver panics with ``driver version "<v>" not found in abis map``.
- ``loading container: file does not exist`` (runsc) / ``container does not exist`` (runc).

Order matters: the more specific nvproxy patterns are checked before the generic
"not found", which the ABI-map panic would otherwise match.
"""

from __future__ import annotations

import re

from substrate_gpu import exceptions
from substrate_gpu.runsc import api

#: (pattern, error class), first match wins. Matched case-insensitively: gVisor's
#: capitalisation of "Nvidia" has changed between releases.
_RULES: tuple[tuple[str, type[api.RunscError]], ...] = (
    (r"can't save with live nvproxy clients", api.LiveNvproxyClientsError),
    (r"nvproxy\.\w+FD is not saveable", api.LiveNvproxyClientsError),
    (r"nvproxy: object handle \S+ .*is not restorable", api.NotRestorableError),
    (r"nvproxy\.\w+FD is not restorable", api.NotRestorableError),
    (r"unsupported nvidia driver version", api.UnsupportedDriverError),
    (r"driver version \S+ not found in abis map", api.UnsupportedDriverError),
    (r"\bin state stopped\b", api.ContainerStoppedError),
    (r"does not exist|not found", api.ContainerNotFoundError),
)
_COMPILED = tuple((re.compile(p, re.IGNORECASE), cls) for p, cls in _RULES)


def error_class(stderr: str) -> type[api.RunscError]:
    """The typed error runsc's ``stderr`` describes (plain :class:`RunscError` if none)."""
    for pattern, cls in _COMPILED:
        if pattern.search(stderr):
            return cls
    return api.RunscError


def from_command_error(failure: exceptions.ExternalCommandError) -> api.RunscError:
    """Map a failed runsc command (from :func:`substrate_gpu._process.run_command`) into
    its typed error.

    The message is the command error's own ("while checkpointing container a1: runsc exited
    with status 128; stderr: …"). A timeout, or a runsc that never started, maps to plain
    :class:`RunscError` (``timed_out`` kept): a killed runsc said nothing we can trust.
    """
    cls = (
        api.RunscError
        if failure.timed_out or failure.returncode is None
        else error_class(failure.stderr)
    )
    return cls(
        str(failure),
        argv=failure.argv,
        returncode=failure.returncode,
        stderr=failure.stderr,
        timed_out=failure.timed_out,
    )
