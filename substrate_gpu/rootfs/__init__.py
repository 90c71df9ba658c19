"""Writing into the untrusted actor rootfs: confined writes and SONAME link staging.

- :mod:`~substrate_gpu.rootfs.confined` resolves paths inside the rootfs with
  ``RESOLVE_IN_ROOT`` semantics (directory descriptors, never string checks) and creates
  symlinks there without ever following the final component;
- :mod:`~substrate_gpu.rootfs.sonames` reads ``DT_SONAME`` from host libraries through the
  program headers only, and caches it per file version;
- :mod:`~substrate_gpu.rootfs.staging` creates the links ``ldconfig -n`` would have created
  for the bind-mounted driver libraries (we skip nvidia-ctk's update-ldcache hook).
"""

from __future__ import annotations

from substrate_gpu.rootfs.confined import (
    ConfinedPathError,
    LinkOutcome,
    ensure_symlink_in_root,
    open_dir_in_root,
)
from substrate_gpu.rootfs.sonames import (
    SonameAbsent,
    SonameCache,
    SonameFound,
    SonameResult,
    SonameUnreadable,
    read_soname,
)
from substrate_gpu.rootfs.staging import (
    SkippedLibrary,
    SkipReason,
    StagedLink,
    StagingReport,
    plan_soname_links,
    stage_soname_links,
)

__all__ = [
    "ConfinedPathError",
    "LinkOutcome",
    "SkipReason",
    "SkippedLibrary",
    "SonameAbsent",
    "SonameCache",
    "SonameFound",
    "SonameResult",
    "SonameUnreadable",
    "StagedLink",
    "StagingReport",
    "ensure_symlink_in_root",
    "open_dir_in_root",
    "plan_soname_links",
    "read_soname",
    "stage_soname_links",
]
