"""Classifying ``cuda-checkpoint``'s failures into the typed errors of :mod:`.api`.

The tool prints the CUDA driver's error string in double quotes, as in the real
``Error initializing CUDA: "OS call failed or operation not supported on this OS"``; the
prose around it varies by release, the ``cuGetErrorString`` texts do not. So we match the
error strings:

- ``timed out`` — ``CUDA_ERROR_TIMEOUT``: ``--action lock --timeout MS`` gave up; the
  process is still ``running``.
- ``invalid argument`` / ``initialization error`` — ``CUDA_ERROR_INVALID_VALUE`` /
  ``CUDA_ERROR_NOT_INITIALIZED``: no such pid, or a pid without a CUDA context (an
  NVML-only process is one).
- ``the operation cannot be performed in the present state`` — ``CUDA_ERROR_ILLEGAL_STATE``.
- ``operation not supported`` (and ``… on this OS``) — ``CUDA_ERROR_NOT_SUPPORTED`` /
  ``CUDA_ERROR_OPERATING_SYSTEM``: the driver cannot do it.
- The exec found no ``cuda-checkpoint``: runc's ``executable file not found in $PATH`` and
  gVisor's ``no such file or directory`` when starting it.
"""

from __future__ import annotations

import re

from substrate_gpu.cudackpt import api

_TOOL_MISSING = r"executable file not found|exec(?:utable)?[^\n]*: no such file or directory"
_RULES: tuple[tuple[str, type[api.CudaCheckpointError]], ...] = (
    (_TOOL_MISSING, api.ToolUnavailableError),
    (r"timed out|\btimeout\b", api.LockTimeoutError),
    (r"cannot be performed in the present state|illegal state", api.IllegalStateError),
    (r"operation not supported", api.CheckpointUnsupportedError),
    (r'"invalid argument"|"initialization error"|no such process', api.NotACudaProcessError),
)
_COMPILED = tuple((re.compile(p, re.IGNORECASE), cls) for p, cls in _RULES)


def error_class(output: str) -> type[api.CudaCheckpointError]:
    """The typed error ``output`` (the tool's stderr and stdout) describes."""
    for pattern, cls in _COMPILED:
        if pattern.search(output):
            return cls
    return api.CudaCheckpointError
