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
- ``FetchSpec failed: loading container: file does not exist`` — any command on an unknown
  id (runc says ``container does not exist``).
- ``creating container: cannot lock container metadata file: container already exists``.
- ``FetchSpec failed: reading spec: error opening spec file "<b>/config.json": …`` — a
  bundle without (or with an unreadable) config.json.
- ``starting container: opening state file "<dir>/checkpoint.img" failed: …`` — restore
  from a missing image; ``checkpoint failed: creating checkpoint state file …: file exists``
  and ``making directories at path provided: …`` — a checkpoint that cannot write its image.
- ``cannot <verb> container "<id>" in state <status>`` — ``Container.requireStatus``;
  ``connecting to control server at PID <n>: connection refused`` — the sandbox is gone
  (a killed sandbox whose status has not caught up yet).
- ``failed to get Nvidia driver version: failed to open /dev/nvidiactl: …`` — ``--nvproxy``
  (or a spec with NVIDIA devices) on a host without the NVIDIA driver.

Every one of these texts was read from the runsc that ``scripts/build-runsc.sh`` builds;
``tests/runsc/test_real_errors.py`` provokes each against it.
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
    (r"failed to get nvidia driver version", api.NvproxyUnavailableError),
    (r"\bin state stopped\b", api.ContainerStoppedError),
    (r"connecting to control server at pid \d+: connection refused", api.ContainerStoppedError),
    (r"\bcannot \w+ container \"[^\"]*\" in state \w+", api.WrongStateError),
    (r"container already exists|container with id exists", api.ContainerExistsError),
    (r"reading spec: |error opening spec file", api.BundleError),
    (
        r"opening state file |creating checkpoint state file |making directories at path",
        api.CheckpointImageError,
    ),
    (r"loading container: |container does not exist", api.ContainerNotFoundError),
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
