"""Generating the worker's CDI spec with the NVIDIA Container Toolkit, once.

``nvidia-ctk cdi generate --format=json --library-search-path=<driver-root>/lib64
--output=<dir>/nvidia.json`` run with ``PATH=<driver-root>/bin:$PATH`` so that nvidia-smi
and friends are found and end up in the spec (brief §3.1).

- The toolkit is the host's, mounted read-only into the worker at ``/opt/nvidia-toolkit``.
  ``nvidia-ctk.real`` is preferred when present: the plain name is often a shell wrapper.
- Generation happens once per worker, under a lock; concurrent first actors wait for the
  one run. A **failure is not memoised**: the next actor retries (the driver may have been
  mid-install). A success is: the spec is parsed once and shared (it is immutable).
- The tool writes to a temporary name; we parse it and only then rename it into place, so
  a reader never sees a torn or invalid ``nvidia.json``.
- The run is bounded by a timeout that kills the whole process group (the wrapper *and*
  ``nvidia-ctk.real``); the tool's stderr is in the error.
- nvidia-ctk is a glibc binary. In a distroless or musl worker image its ELF interpreter
  is missing and exec fails with a bare ENOENT; we say so plainly.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from substrate_gpu import _defaults, exceptions
from substrate_gpu import cdi as cdi_
from substrate_gpu._log import get_logger
from substrate_gpu.injection import hooks as hooks_

if TYPE_CHECKING:
    from collections.abc import Mapping

    from substrate_gpu.cdi import model

log = get_logger(__name__)

ENV_DRIVER_ROOT = _defaults.DRIVER_ROOT_ENV
DEFAULT_DRIVER_ROOT = _defaults.DRIVER_ROOT
DEFAULT_TOOLKIT_DIR = _defaults.TOOLKIT_DIR
SPEC_FILE_NAME = "nvidia.json"


@dataclass(frozen=True)
class ToolkitConfig:
    """How to run nvidia-ctk on this worker."""

    driver_root: Path = DEFAULT_DRIVER_ROOT
    """The driver root; ``lib64`` and ``bin`` derive from it."""
    toolkit_dir: Path = DEFAULT_TOOLKIT_DIR
    """Where the host's toolkit is mounted in the worker."""
    output_dir: Path = Path("/var/run/cdi")
    """Where ``nvidia.json`` is written."""
    timeout: float = 120.0
    """Seconds before the run (and its process group) is killed."""
    base_env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    """Environment the tool runs with (``PATH`` gets ``<driver-root>/bin`` prepended)."""

    @classmethod
    def from_env(
        cls,
        env: Mapping[str, str],
        *,
        output_dir: Path,
        toolkit_dir: Path = DEFAULT_TOOLKIT_DIR,
        timeout: float = 120.0,
    ) -> ToolkitConfig:
        """Read ``ATE_NVIDIA_DRIVER_ROOT`` (default ``/usr/local/nvidia``) from ``env``."""
        return cls(
            driver_root=Path(env.get(ENV_DRIVER_ROOT) or DEFAULT_DRIVER_ROOT),
            toolkit_dir=toolkit_dir,
            output_dir=output_dir,
            timeout=timeout,
            base_env=dict(env),
        )

    @property
    def spec_path(self) -> Path:
        """The generated spec's final path."""
        return self.output_dir / SPEC_FILE_NAME


def toolkit_binary(toolkit_dir: Path, name: str) -> Path:
    """``<dir>/<name>.real`` when it exists, else ``<dir>/<name>``."""
    real = toolkit_dir / f"{name}.real"
    return real if real.exists() else toolkit_dir / name


def hook_binary(toolkit_dir: Path) -> str:
    """The toolkit's ``nvidia-cdi-hook``, preferring ``nvidia-cdi-hook.real`` (the plain
    name is often a shell wrapper that needs tools the sandbox host side lacks).

    Always an absolute path: it becomes a hook's ``path`` in config.json, which the
    runtime-spec requires to be absolute (a relative one would be looked up from wherever
    the runtime happens to run), so a relative ``toolkit_dir`` is taken from the current
    directory now."""
    return str(toolkit_binary(toolkit_dir.absolute(), hooks_.HOOK_BINARY_NAME))


def generate_argv(config: ToolkitConfig, output: Path) -> list[str]:
    """The exact nvidia-ctk command line (brief §3.1)."""
    return [
        str(toolkit_binary(config.toolkit_dir, "nvidia-ctk")),
        "cdi",
        "generate",
        "--format=json",
        f"--library-search-path={config.driver_root / 'lib64'}",
        f"--output={output}",
    ]


def generate_env(config: ToolkitConfig) -> dict[str, str]:
    """The tool's environment: ``PATH=<driver-root>/bin:$PATH``."""
    env = dict(config.base_env)
    path = env.get("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
    env["PATH"] = f"{config.driver_root / 'bin'}:{path}"
    return env


def elf_interpreter(path: Path) -> str | None:
    """The PT_INTERP of an ELF executable, ``None`` if it has none or is not ELF."""
    from elftools.common.exceptions import ELFError  # noqa: PLC0415  (cold error path only)
    from elftools.elf.elffile import ELFFile  # noqa: PLC0415
    from elftools.elf.segments import InterpSegment  # noqa: PLC0415

    try:
        with path.open("rb") as f:
            for segment in ELFFile(f).iter_segments():
                if isinstance(segment, InterpSegment):
                    interp: str = segment.get_interp_name()
                    return interp
    except (OSError, ELFError, ValueError, AssertionError, OverflowError):
        return None
    return None


def _explain_exec_failure(binary: Path, error: exceptions.ExternalCommandError) -> str:
    cause = error.__cause__
    if isinstance(cause, OSError) and cause.errno == errno.ENOENT and binary.exists():
        interp = elf_interpreter(binary)
        if interp is not None and not Path(interp).exists():
            return (
                f"{binary} exists but cannot execute: its ELF interpreter {interp} is missing. "
                "nvidia-ctk needs a glibc-based worker runtime image (not distroless or musl); "
                "rebuild the worker image on a glibc base"
            )
    return str(error)


class GenerationMetrics(Protocol):
    """Where generation outcomes are counted (``AgentMetrics`` implements it)."""

    def toolkit_generation(self, outcome: str, seconds: float) -> None:
        """One nvidia-ctk run ended with ``outcome`` (ok, error, timeout) after ``seconds``."""
        ...


class CdiSpecGenerator:
    """Generates and caches this worker's CDI spec; safe to share between actors."""

    def __init__(self, config: ToolkitConfig, *, metrics: GenerationMetrics | None = None) -> None:
        # anyio and the process runner only here: `inject` and `cdi show` use this module's
        # paths and never generate, and importing them would slow their start
        # (tests/bench/bench_cli.py).
        import anyio  # noqa: PLC0415

        self.config = config
        self.metrics = metrics
        self._lock = anyio.Lock()
        self._spec: model.Spec | None = None

    @property
    def cached(self) -> model.Spec | None:
        """The spec if it was generated already."""
        return self._spec

    async def ensure_spec(self) -> model.Spec:
        """The worker's spec, generating it on first use (once, under the lock)."""
        if self._spec is not None:
            return self._spec
        async with self._lock:
            if self._spec is None:  # another actor may have generated it while we waited
                started = time.monotonic()
                outcome = "error"
                try:
                    self._spec = await self._generate()
                    outcome = "ok"
                except exceptions.ToolkitError as e:
                    cause = e.__cause__
                    if isinstance(cause, exceptions.ExternalCommandError) and cause.timed_out:
                        outcome = "timeout"
                    raise
                finally:
                    if self.metrics is not None:
                        self.metrics.toolkit_generation(outcome, time.monotonic() - started)
            return self._spec

    async def _generate(self) -> model.Spec:
        config = self.config
        try:
            config.output_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise exceptions.ToolkitError(
                f"while generating the CDI spec: cannot create {config.output_dir}: "
                f"{e.strerror or e}"
            ) from e
        tmp = config.output_dir / f".{SPEC_FILE_NAME}.{os.getpid()}.tmp"
        argv = generate_argv(config, tmp)
        log.info("cdi_spec_generating", argv=argv)
        from substrate_gpu import _process  # noqa: PLC0415  (see __init__)

        try:
            await _process.run_command(
                argv,
                timeout=config.timeout,
                what="generating the CDI spec with nvidia-ctk",
                env=generate_env(config),
            )
            if not tmp.exists():
                raise exceptions.ToolkitError(
                    f"while generating the CDI spec: {argv[0]} exited 0 but wrote no {tmp}"
                )
            spec = cdi_.load_spec(tmp)
            cdi_.edits_for_all(spec, refuse_mig=False)  # fail now, not at the first injection
            tmp.replace(config.spec_path)
            spec = dataclasses.replace(spec, source=str(config.spec_path))
        except exceptions.ExternalCommandError as e:
            raise exceptions.ToolkitError(
                f"while generating the CDI spec: {_explain_exec_failure(Path(argv[0]), e)}"
            ) from e
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
        log.info(
            "cdi_spec_generated",
            path=str(config.spec_path),
            devices=len(spec.devices),
            ignored_fields=len(spec.ignored_fields),
        )
        if spec.warning is not None:  # a toolkit newer than this parser
            log.warning("cdi_spec_version_newer", detail=spec.warning)
        return spec
