"""The createContainer hook allowlist, and the reason for each toolkit hook we know.

An allowlist, not a denylist: newer toolkits keep adding hooks and a hook we have not
reviewed must not run on the host side of a sandbox by default. Every decision carries its
reason, which goes into the ``cdi_hook_skipped`` log line (and docs/gpu-injection.md):

Kept:

- ``create-symlinks`` — the ``libcuda.so -> libcuda.so.1``-style development links and
  ``/dev/dri/by-path`` links; harmless and needed by some images.
- ``enable-cuda-compat`` — points the image's forward-compat CUDA libraries at the host
  driver version.

Skipped (:data:`SKIP_REASONS`):

- ``update-ldcache`` — up to 1.20.0 its ldconfig unshares a mount namespace and mounts a
  private /proc: the kernel refuses that under the pod's masked /proc, and unmasking it
  needs a user namespace that breaks per-actor cgroup delegation. 1.20.1 no longer mounts
  a procfs (it masks the rootfs's /proc and /sys with empty tmpfs and execs the host's
  ldconfig from a sealed memfd), but the hook still enters new mount, PID and network
  namespaces as root on the host side, pivots into the untrusted rootfs and runs an
  unaudited binary over the image's ld.so.conf and libraries, and a spec does not say which
  toolkit will run it. We stage the SONAME links ourselves, confined
  (:mod:`substrate_gpu.rootfs.staging`; the same links ``ldconfig -n`` makes).
- ``disable-device-node-modification`` (toolkit ≥ 1.17.8) — bind-mounts a copy of
  ``/proc/driver/nvidia/params`` with ``ModifyDeviceFiles: 0`` over the container's, so the
  driver libraries do not create device nodes (1.20.2 makes that mount read-only). Inside
  gVisor that file is the sentry's: runsc emulates ``ModifyDeviceFiles=0`` itself and skips
  this hook, and a host-side mount into the sandbox's /proc would not reach it.
- ``update-application-profile`` (toolkit 1.20) — writes an NVIDIA driver application
  profile (per-application user-mode driver settings) into the container's rootfs. Compute
  workloads do not need it, and a host-side write into the untrusted rootfs by a hook we
  cannot confine is exactly what the allowlist exists to stop; revisit if a workload
  needs a profile (we would write it ourselves, confined, like the SONAME links).
- ``chmod`` (deprecated, off by default) — changes the mode of paths such as
  ``/dev/nvidia-caps`` in the container; in gVisor the sentry creates ``/dev`` from the
  OCI device list with the modes we give, and those paths are the MIG capability nodes,
  which we refuse (nvproxy has no MIG support).
- ``apply-cuda-memory-limits`` (toolkit 1.20.1) — a ``createRuntime`` hook in every GPU
  device's edits (``--driver-root R --gpu-id <uuid>``): reads ``NVIDIA_GPU_MEMORY_REQUEST``
  and ``NVIDIA_GPU_MEMORY_LIMIT`` (MiB) from the container's env, needs cgroup v2, resolves
  the container's cgroup from its pid and calls the host's NVML (``SetMemoryLimits_v1``)
  on each ``--gpu-id``. Under gVisor that pid's cgroup is the whole sandbox's, and the hook
  loads the host driver's libnvidia-ml into a root process on the host side on behalf of
  an env the untrusted workload chose; GPU memory is not limited per actor here (the
  allocator never shares a GPU). Without either variable it does nothing; with one, the
  injection logs ``gpu_memory_limits_not_applied`` (:func:`unapplied_memory_limits`).
- ``check-requirements`` (toolkit main, 2026) — parses the image's ``NVIDIA_REQUIRE_*``
  constraints against the host driver, on the host side, to fail a container early; the
  workload's own CUDA init reports the same mismatch, and the driver preflight
  (:mod:`substrate_gpu.preflight`) checks what nvproxy needs.
- ``create-soname-symlinks`` (1.18.0-rc.1 only, then removed) — ran ldconfig in the
  container root to create SONAME links: the same objection as ``update-ldcache``, and we
  stage those links ourselves.
- ``update-nvidia-params`` — the development name of ``disable-device-node-modification``:
  skipped for the same reason.
- any other hook: not in the allowlist (unreviewed).

The subcommand's position differs by toolkit version: ``nvidia-ctk hook <name> …``
(≤ 1.15) and ``nvidia-cdi-hook <name> …`` (≥ 1.16). Kept hooks are rewritten to run the
toolkit mounted into the worker (``/opt/nvidia-toolkit/nvidia-cdi-hook``), since the
spec's own path (``/usr/bin/nvidia-cdi-hook``) names the host's layout.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from collections.abc import Sequence

    from substrate_gpu.cdi import model

#: The only hook point we run toolkit hooks at.
HOOK_POINT = "createContainer"

#: Subcommands allowed to run.
KEPT_SUBCOMMANDS = frozenset({"create-symlinks", "enable-cuda-compat"})

#: Why each known toolkit hook outside the allowlist is skipped (the module docstring says more).
SKIP_REASONS: dict[str, str] = {
    "update-ldcache": (
        "runs the host's ldconfig in new namespaces pivoted into the untrusted rootfs (up to"
        " 1.20.0 also a private /proc, refused under the pod's masked /proc); SONAME links are"
        " staged instead"
    ),
    "disable-device-node-modification": (
        "runsc emulates ModifyDeviceFiles=0 in the sentry's /proc/driver/nvidia/params and"
        " skips this hook itself"
    ),
    "update-application-profile": (
        "writes a driver application profile into the untrusted rootfs from the host side;"
        " compute workloads do not need it"
    ),
    "chmod": (
        "deprecated; the sentry creates /dev with the modes we give, and its paths"
        " (/dev/nvidia-caps) are MIG nodes, which are refused"
    ),
    "apply-cuda-memory-limits": (
        "a createRuntime hook calling the host's NVML on the sandbox's whole cgroup, driven by"
        " env the workload chose (NVIDIA_GPU_MEMORY_REQUEST/LIMIT); GPUs are not shared, so"
        " not limited"
    ),
    "check-requirements": (
        "checks the image's NVIDIA_REQUIRE_* on the host side; CUDA init reports a mismatch"
        " and the driver preflight checks what nvproxy needs"
    ),
    "create-soname-symlinks": (
        "runs ldconfig in the container root (1.18.0-rc.1 only); SONAME links are staged instead"
    ),
    "update-nvidia-params": (
        "the development name of disable-device-node-modification: runsc emulates"
        " ModifyDeviceFiles=0 itself"
    ),
}

#: The binary kept hooks are rewritten to call.
HOOK_BINARY_NAME = "nvidia-cdi-hook"


@dataclass(frozen=True)
class HookDecision:
    """What happens to one hook of the spec."""

    hook: model.Hook
    """The hook as the spec gives it."""
    subcommand: str | None
    """The toolkit subcommand (``create-symlinks``), or ``None`` if not a toolkit hook."""
    verdict: Literal["keep", "skip"]
    """Whether it is injected."""
    reason: str
    """Why, for the skip log."""

    @property
    def name(self) -> str:
        """A bounded, loggable name: the subcommand, else the executable's basename."""
        return self.subcommand or posixpath.basename(self.hook.path) or "unknown"


def hook_subcommand(hook: model.Hook) -> str | None:
    """The toolkit subcommand a hook runs, for both argv shapes; ``None`` if it is not one."""
    args = hook.args or (hook.path,)
    program = posixpath.basename(args[0]) if args else ""
    if program.startswith("nvidia-ctk"):
        # nvidia-ctk hook <name> …
        return args[2] if len(args) > 2 and args[1] == "hook" else None
    if program.startswith(HOOK_BINARY_NAME):
        return args[1] if len(args) > 1 else None
    return None


def classify_hook(hook: model.Hook) -> HookDecision:
    """Decide whether ``hook`` is kept, and why (a reviewed hook's own reason at any hook
    point: apply-cuda-memory-limits is a createRuntime hook)."""
    subcommand = hook_subcommand(hook)
    if subcommand is not None and subcommand in SKIP_REASONS:
        return HookDecision(hook, subcommand, "skip", SKIP_REASONS[subcommand])
    if hook.hook_name != HOOK_POINT:
        return HookDecision(hook, subcommand, "skip", f"hook point {hook.hook_name} is not run")
    if subcommand is None:
        return HookDecision(hook, None, "skip", "not an NVIDIA toolkit hook")
    if subcommand not in KEPT_SUBCOMMANDS:
        reason = SKIP_REASONS.get(subcommand, "not in the hook allowlist (unreviewed)")
        return HookDecision(hook, subcommand, "skip", reason)
    return HookDecision(hook, subcommand, "keep", "allowlisted")


def rewrite_hook(hook: model.Hook, subcommand: str, hook_binary: str) -> model.Hook:
    """The hook re-pointed at the mounted toolkit's ``nvidia-cdi-hook``, same arguments."""
    args = hook.args or (hook.path,)
    program = posixpath.basename(args[0])
    rest = args[3:] if program.startswith("nvidia-ctk") else args[2:]
    return replace(hook, path=hook_binary, args=(HOOK_BINARY_NAME, subcommand, *rest))


#: The env ``apply-cuda-memory-limits`` reads (MiB): what a workload asks for in vain here.
MEMORY_LIMIT_ENV = ("NVIDIA_GPU_MEMORY_REQUEST", "NVIDIA_GPU_MEMORY_LIMIT")


def unapplied_memory_limits(skipped: Sequence[str], env: Sequence[object]) -> tuple[str, ...]:
    """The ``NVIDIA_GPU_MEMORY_*`` variables the container's ``env`` sets that nothing will
    apply, because ``apply-cuda-memory-limits`` is among the ``skipped`` hooks; empty when
    the spec has no such hook (an older toolkit) or the env sets neither."""
    if "apply-cuda-memory-limits" not in skipped:
        return ()
    names = {e.partition("=")[0] for e in env if isinstance(e, str)}
    return tuple(name for name in MEMORY_LIMIT_ENV if name in names)
