"""The one error hierarchy users of substrate-gpu catch.

Every message says what was being done, on which object, and what to do about it
("while injecting GPUs into bundle /b: ..."). Low-level errors (OSError, ELFError,
json/yaml errors, subprocess failures) are mapped into these at the boundary and chained
with ``from e`` so the cause is never lost.
"""

from __future__ import annotations


class SubstrateGpuError(Exception):
    """Base class of every error substrate-gpu raises on purpose."""


class CdiSpecError(SubstrateGpuError):
    """A CDI spec is unreadable or invalid.

    ``source`` names the file (or ``<string>``), ``field`` the JSON path inside it
    (e.g. ``devices[3].containerEdits.mounts[2].hostPath``), ``problem`` what is wrong.
    """

    def __init__(self, source: str, field: str, problem: str) -> None:
        self.source = source
        self.field = field
        self.problem = problem
        where = f"{source}: {field}" if field else source
        super().__init__(f"invalid CDI spec {where}: {problem}")


class InjectionError(SubstrateGpuError):
    """GPU injection into an OCI bundle failed; the bundle's config.json is left untouched."""


class DeviceResolutionError(InjectionError):
    """A device node named by the CDI spec cannot be resolved on the host."""


class DeviceRequestError(InjectionError):
    """A request for CDI devices cannot be met: a malformed, unknown or conflicting name.

    Raised before anything is written; the message names every offending device and what
    the spec set offers instead.
    """


class MigDeviceRefused(DeviceRequestError):
    """A MIG device (or a MIG capability node) was requested: nvproxy has no MIG support."""


class RootfsEscapeError(InjectionError):
    """A write into the actor rootfs would have landed outside it (hostile symlinks)."""


class ToolkitError(SubstrateGpuError):
    """Running the NVIDIA Container Toolkit (``nvidia-ctk cdi generate``) failed."""


class ExternalCommandError(SubstrateGpuError):
    """An external command failed, timed out or could not be started.

    Carries the argv, exit status (``None`` when it never exited on its own) and stderr so
    callers can classify the failure (runsc's messages, nvidia-ctk's messages).
    """

    def __init__(
        self,
        message: str,
        *,
        argv: tuple[str, ...],
        returncode: int | None,
        stderr: str,
        timed_out: bool = False,
    ) -> None:
        self.argv = argv
        self.returncode = returncode
        self.stderr = stderr
        self.timed_out = timed_out
        super().__init__(message)


class ConfigError(SubstrateGpuError):
    """Configuration given to substrate-gpu (CLI flags, env, files) is invalid."""
