"""Injecting a worker's GPUs into one actor container's OCI bundle (the effectful shell).

Order of work, chosen so that a failure anywhere leaves ``config.json`` untouched:

1. read and parse ``config.json``, reached through real directories only and never
   blocking (:mod:`substrate_gpu._bundle`: a symlink or a FIFO is refused, naming it);
2. resolve every device node on the host (a missing node fails here, before any write);
3. plan the edits (pure, :mod:`substrate_gpu.injection.oci`);
4. if the bundle holds GPU nodes the plan does not grant (an earlier injection of other or
   more GPUs), refuse; else, if it already holds those device nodes, stop: injection is
   idempotent (one guard, :func:`oci.already_injected`, in that order);
5. stage the SONAME links in the actor rootfs (confined to it; idempotent on retry);
6. write ``config.json`` atomically (temp file, fsync, rename), keeping its mode, in the
   directory it was read from (its descriptor, held since step 1).

Step 6 is the commit point: a crash before it leaves the old config, after it the new one.
The pod's pause/root container is never injected (it holds no GPU; runsc still needs
``--nvproxy`` for it, which the runsc driver handles).
"""

from __future__ import annotations

import os
import posixpath
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal, cast

from substrate_gpu import _bundle, _files, exceptions
from substrate_gpu._log import get_logger
from substrate_gpu.injection import devices as devices_
from substrate_gpu.injection import hooks as hooks_
from substrate_gpu.injection import oci, toolkit
from substrate_gpu.rootfs import staging

if TYPE_CHECKING:
    import structlog

    from substrate_gpu.cdi import model
    from substrate_gpu.rootfs.sonames import SonameCache

log = get_logger(__name__)


@dataclass(frozen=True)
class InjectionOptions:
    """Where things are on this worker."""

    driver_root: str = str(toolkit.DEFAULT_DRIVER_ROOT)
    """The NVIDIA driver root (``lib64`` and ``bin`` derive from it)."""
    dev_root: Path = Path("/")
    """Host-root prefix for stat-ing device nodes (``/`` on a node; a test tree in tests)."""
    toolkit_dir: Path = toolkit.DEFAULT_TOOLKIT_DIR
    """The mounted toolkit; kept hooks run its ``nvidia-cdi-hook`` (``.real`` preferred)."""
    stage_soname_links: bool = True
    """Create the SONAME links update-ldcache would have created."""


@dataclass(frozen=True)
class InjectionReport:
    """What one injection did."""

    bundle: Path
    """The bundle directory."""
    outcome: Literal["injected", "already-injected", "sandbox-container", "withheld"]
    """``injected``; ``already-injected`` (idempotency guard, nothing written);
    ``sandbox-container`` (the pause container, nothing written); ``withheld`` (a sandbox's
    app container given no GPU: :func:`withhold_gpus`)."""
    devices: tuple[devices_.ResolvedDevice, ...] = ()
    """The device nodes of the plan."""
    mounts: int = 0
    """Mounts in the plan."""
    hooks_kept: tuple[str, ...] = ()
    """Subcommands of the hooks injected."""
    hooks_skipped: tuple[str, ...] = ()
    """Names of the hooks left out."""
    links: staging.StagingReport | None = None
    """SONAME links staged (``None`` when staging did not run)."""
    seconds: float = 0.0
    """Wall time of the injection."""


_Devices = tuple[devices_.ResolvedDevice, ...]


@dataclass(frozen=True)
class _Resolution:
    """The last device resolution of a :class:`PlanCache`, and what vouches for it."""

    edits: model.ContainerEdits
    dev_root: Path
    fingerprint: tuple[object, ...]
    resolved: _Devices


class PlanCache:
    """Remembers the last injection plan, so later actors on a worker skip re-planning.

    The plan is a pure function of the edits, the resolved devices, the driver root and the
    hook binary. The edits are compared by identity (the worker's parsed spec is shared and
    immutable; the agent keeps one edits object per requested device set), the rest by
    value; only the last device set is kept (more bought nothing a user sees: a plan costs
    next to nothing beside ``runsc create``; docs/gpu-injection.md).
    The resolution of the device nodes is reused while they stat the same (one ``stat``
    a node). Safe to share between threads: each entry is replaced as one object.
    """

    def __init__(self) -> None:
        # The last (edits, key, plan) and the last device resolution.
        self._plan: tuple[model.ContainerEdits, tuple[object, ...], oci.InjectionPlan] | None
        self._plan = None
        self._resolution: _Resolution | None = None
        self._hook_binaries: dict[Path, str] = {}
        # (hook, reason) verdicts already logged: said once per worker's spec, not per actor.
        self._verdicts_said: set[tuple[str, str]] = set()

    def hook_binary(self, toolkit_dir: Path) -> str:
        """:func:`~substrate_gpu.injection.toolkit.hook_binary`, chosen once per worker
        like its spec (which nvidia-ctk of the same mounted toolkit generated once)."""
        chosen = self._hook_binaries.get(toolkit_dir)
        if chosen is None:
            chosen = self._hook_binaries[toolkit_dir] = toolkit.hook_binary(toolkit_dir)
        return chosen

    def resolve(
        self, edits: model.ContainerEdits, dev_root: Path
    ) -> tuple[devices_.ResolvedDevice, ...]:
        """:func:`devices.resolve_device_numbers` for ``edits``' nodes, reused while every
        node stat-s the same (type and numbers: all the resolution reads)."""
        last = self._resolution
        fingerprint = devices_.host_fingerprint(edits.device_nodes, dev_root=dev_root)
        if (
            last is not None
            and last.edits is edits
            and last.dev_root == dev_root
            and fingerprint == last.fingerprint
        ):
            return last.resolved
        resolved = devices_.resolve_device_numbers(edits.device_nodes, dev_root=dev_root)
        self._resolution = _Resolution(edits, dev_root, fingerprint, resolved)
        return resolved

    def plan(
        self,
        edits: model.ContainerEdits,
        resolved: tuple[devices_.ResolvedDevice, ...],
        *,
        driver_root: str,
        hook_binary: str,
    ) -> oci.InjectionPlan:
        """The plan for these inputs, computed only when they changed."""
        key = (resolved, driver_root, hook_binary)
        last = self._plan
        if last is not None and last[0] is edits and last[1] == key:
            return last[2]
        plan = oci.plan_injection(edits, resolved, driver_root=driver_root, hook_binary=hook_binary)
        self._plan = (edits, key, plan)
        self._say_hook_verdicts(plan)
        return plan

    def _say_hook_verdicts(self, plan: oci.InjectionPlan) -> None:
        """Log each skipped hook, with its reason, the first time a plan skips it: the spec
        decides it (every actor of the worker gets the same verdict), so one line per spec
        load, not per injection (the per-injection line counts them: ``hooks_skipped``)."""
        for decision in plan.skipped_hooks:
            said = (decision.name, decision.reason)
            if said not in self._verdicts_said:
                self._verdicts_said.add(said)
                log.info("cdi_hook_skipped", hook=decision.name, reason=decision.reason)


def read_config(bundle: Path) -> oci.OciConfig:
    """Parse ``<bundle>/config.json``; errors name the file and the problem."""
    try:
        config, _ = _bundle.read_config(bundle)
    except _bundle.BundleFileError as e:
        raise exceptions.InjectionError(f"while injecting GPUs into bundle {bundle}: {e}") from e
    # Typed for what it should hold; nested values are checked where they are used.
    return cast("oci.OciConfig", config)


#: The largest config.json read (:mod:`substrate_gpu._bundle` holds the limit).
MAX_CONFIG_BYTES = _bundle.MAX_CONFIG_BYTES


def rootfs_of(bundle: Path, config: oci.OciConfig) -> Path:
    """The bundle's root filesystem directory (``root.path``, relative to the bundle)."""
    root = config.get("root")
    path = root.get("path") if isinstance(root, dict) else None
    if not isinstance(path, str) or not path:
        raise exceptions.InjectionError(
            f"while injecting GPUs into bundle {bundle}: config.json has no root.path"
        )
    return bundle / path  # an absolute path replaces the bundle prefix


def open_rootfs(bundle: Path, config: oci.OciConfig, bundle_fd: int) -> int:
    """An O_PATH descriptor of the bundle's rootfs, reached through real directories only.

    ``root.path`` is walked one component at a time with ``O_NOFOLLOW`` (from the bundle's
    descriptor ``bundle_fd`` when relative, from ``/`` when absolute, as podman writes
    it): a symlink anywhere on it is refused, or the SONAME links would land wherever it
    points, outside the bundle. runc refuses such a rootfs too ("not an absolute path, or
    a symlink"). A relative path must stay in the bundle (no leading ``..``). The caller
    closes the descriptor.
    """
    path = rootfs_of(bundle, config)
    root_path = str(config["root"]["path"])  # rootfs_of checked it is a non-empty string
    where = f"while injecting GPUs into bundle {bundle}: rootfs {path}"
    parts = [p for p in posixpath.normpath(root_path).split("/") if p]
    if not root_path.startswith("/") and parts[:1] == [".."]:
        raise exceptions.InjectionError(
            f"{where}: root.path {root_path!r} leaves the bundle; give an absolute path"
        )
    try:
        return _files.open_directory("/" if root_path.startswith("/") else bundle_fd, parts)
    except _files.NotReadable as e:
        raise exceptions.InjectionError(
            f"{where}: {e}; the rootfs must be a real directory (runc refuses a link too)"
        ) from e
    except OSError as e:
        raise exceptions.InjectionError(f"{where}: cannot open it: {e.strerror or e}") from e


def inject_gpu(
    bundle: Path | str,
    edits: model.ContainerEdits,
    *,
    options: InjectionOptions,
    soname_cache: SonameCache,
    plan_cache: PlanCache | None = None,
    container: str | None = None,
) -> InjectionReport:
    """Inject the GPU edits into ``bundle``; see the module docstring for the guarantees.

    ``edits`` are the spec-level edits merged with device ``all``
    (:func:`substrate_gpu.cdi.edits_for_all`) or with named devices
    (:func:`substrate_gpu.cdi.edits_for_devices`): only their device nodes get cgroup
    rules. Raises a subclass of :class:`~substrate_gpu.exceptions.InjectionError`;
    config.json is then untouched.
    ``plan_cache`` (one per worker) lets later actors reuse the plan. ``container``: the
    bundle is ``<bundle>/<container>`` (a sandbox's app container), a real directory of
    ``bundle``, never a link out of it (:mod:`substrate_gpu._bundle`).
    """
    started = time.perf_counter()
    target = Path(bundle) if container is None else Path(bundle) / container
    try:
        with _bundle.open_container(bundle, container) as opened:
            return _inject(
                opened,
                target,
                edits,
                options=options,
                soname_cache=soname_cache,
                plan_cache=plan_cache,
                started=started,
            )
    except _bundle.BundleFileError as e:
        raise exceptions.InjectionError(f"while injecting GPUs into bundle {target}: {e}") from e


def _maybe_warn_memory_limits(
    bound: structlog.typing.FilteringBoundLogger, skipped: tuple[str, ...], config: oci.OciConfig
) -> None:
    """Say when the actor asks for GPU memory limits that the skipped hook would have set."""
    process = config.get("process")
    env = process.get("env") if isinstance(process, dict) else None
    asked = hooks_.unapplied_memory_limits(skipped, env if isinstance(env, list) else [])
    if asked:
        bound.warning(
            "gpu_memory_limits_not_applied",
            variables=",".join(asked),
            reason=hooks_.SKIP_REASONS["apply-cuda-memory-limits"],
        )


def _inject(
    opened: _bundle.ContainerBundle,
    bundle: Path,
    edits: model.ContainerEdits,
    *,
    options: InjectionOptions,
    soname_cache: SonameCache,
    plan_cache: PlanCache | None,
    started: float,
) -> InjectionReport:
    raw_config, mode = opened.read_config()
    # Typed for what it should hold; nested values are checked where they are used.
    config = cast("oci.OciConfig", raw_config)
    bound = log.bind(bundle=str(bundle))
    if oci.is_sandbox_container(config):
        bound.info("gpu_injection_skipped", reason="pod sandbox (pause) container")
        return InjectionReport(bundle=bundle, outcome="sandbox-container")

    plans = plan_cache or PlanCache()
    resolved = plans.resolve(edits, options.dev_root)
    if not resolved:
        raise exceptions.InjectionError(
            f"while injecting GPUs into bundle {bundle}: the CDI edits resolve no device node"
        )
    plan = plans.plan(
        edits,
        resolved,
        driver_root=options.driver_root,
        hook_binary=plans.hook_binary(options.toolkit_dir),
    )
    kept, skipped = plan.hook_subcommands, plan.skipped_hook_names
    # Refuses a bundle holding GPUs the plan does not grant, before calling it done.
    if oci.already_injected(config, plan, where=opened.config_path):
        bound.info("gpu_injection_skipped", reason="bundle already holds the GPU devices")
        return InjectionReport(
            bundle=bundle,
            outcome="already-injected",
            devices=resolved,
            mounts=len(plan.mounts),
            hooks_kept=kept,
            hooks_skipped=skipped,
            seconds=time.perf_counter() - started,
        )
    _maybe_warn_memory_limits(bound, skipped, config)

    links: staging.StagingReport | None = None
    if options.stage_soname_links and plan.libraries:
        rootfs = rootfs_of(bundle, config)
        root_fd = open_rootfs(bundle, config, opened.fd)
        try:
            links = staging.stage_soname_links(
                rootfs, plan.libraries, cache=soname_cache, log=bound, root_fd=root_fd
            )
        finally:
            os.close(root_fd)

    # The commit point: atomic, in the directory the config was read from.
    opened.write_config(oci.apply_plan(config, plan, in_place=True), mode)
    report = InjectionReport(
        bundle=bundle,
        outcome="injected",
        devices=resolved,
        mounts=len(plan.mounts),
        hooks_kept=kept,
        hooks_skipped=skipped,
        links=links,
        seconds=time.perf_counter() - started,
    )
    # The injection's one line at INFO (hook verdicts: once per spec, by the plan cache).
    bound.info(
        "gpu_injected",
        devices=len(resolved),
        mounts=report.mounts,
        hooks_kept=len(kept),
        hooks_skipped=len(skipped),
        links_created=len(links.created) if links is not None else 0,
        seconds=round(report.seconds, 6),
    )
    return report


def withhold_gpus(bundle: Path | str, container: str) -> InjectionReport:
    """Give ``<bundle>/<container>`` no GPU: the app container of a sandbox whose other
    containers name their own GPUs while this one names none (GPUs per container). No
    device node, no mount, no hook, no CDI env: only the image's
    ``NVIDIA_VISIBLE_DEVICES`` is dropped (:func:`oci.withheld`; a config holding an NVIDIA
    node already is refused), written atomically, or not at all when there is none."""
    started = time.perf_counter()
    target = Path(bundle) / container
    try:
        with _bundle.open_container(bundle, container) as opened:
            raw_config, mode = opened.read_config()
            config = cast("oci.OciConfig", raw_config)
            rewritten = oci.withheld(config, where=opened.config_path)
            if rewritten is not None:
                opened.write_config(rewritten, mode)
    except _bundle.BundleFileError as e:
        raise exceptions.InjectionError(f"while withholding GPUs from bundle {target}: {e}") from e
    log.bind(bundle=str(target)).info(
        "gpu_withheld", reason="its config names no GPU", rewritten=rewritten is not None
    )
    return InjectionReport(bundle=target, outcome="withheld", seconds=time.perf_counter() - started)
