"""The production :class:`~substrate_gpu.runsc.api.SandboxRuntime`: drives the runsc binary.

A thin effectful shell around :mod:`substrate_gpu.runsc.argv` (what to run) and
:mod:`substrate_gpu.runsc.errors` (what a failure means). Design decisions:

- Every command runs through :func:`substrate_gpu._process.run_command`: a new session,
  stdio to temporary files (``create``/``restore --detach`` hand their stdio to a sandbox
  that outlives them) and, on timeout or cancellation, SIGKILL to the whole process group.
  A hung runsc can therefore never wedge the agent. Every command also dies with the agent
  (``die_with_parent``: ``PR_SET_PDEATHSIG`` through ``setpriv``), so a killed agent's
  ``runsc start`` cannot land after the restarted agent's recovery decided what runs;
  :meth:`RunscDriver.reap_stragglers` kills any that still run.
- Timeouts are per operation: ``create``, ``restore`` and ``checkpoint`` move a sandbox's
  memory around and get minutes; ``state`` is a metadata read and gets seconds.
- Features are **detected, never assumed** (``runsc --version``, ``runsc help checkpoint``,
  ``runsc help``, ``runsc flags``) and cached after the first success. A failed detection is
  not cached: the next caller asks again.
- ``nvproxy`` is decided per call by the caller: True on ``create`` and ``restore`` of a
  GPU sandbox's containers, ``_pause``'s create above all (see :mod:`.argv`).
- **Upstream's worker flags** (``RunscConfig.upstream_worker_flags``, set for an agent serving
  the worker API): ``--cpu-num-from-quota`` on ``create`` and ``restore``,
  ``--allow-connected-on-save`` on ``start``, and the subcommand flag ``restore
  --background``, as upstream's ``cmd/ateworker-gvisor/runsc.go`` passes them; each only
  when this runsc lists it (``runsc flags``, ``runsc help restore``), so an older runsc is
  run as it was rather than refused.
- :meth:`RunscDriver.for_actor` gives a multi-container sandbox its own ``--root``
  (``<root>/<actor_id>``; runsc makes it on the first create), features detected once;
  :meth:`RunscDriver.remove_root` unmounts and removes it once its containers are gone.
- :meth:`RunscDriver.for_binary` runs another runsc binary (the one atelet staged for an
  activation). Its features and its ``nvproxy list-supported-drivers`` are its
  own, detected once per binary and **cached by the binary's SHA-256** on the driver it
  came from: atelet stages runsc content-addressed, so a re-staged copy of the same build
  is detected once, a new build on its first use. The digest of a path is kept while the
  file stats the same (device, inode, size, mtime), so it is hashed once, off the loop.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast, get_args

import anyio

from substrate_gpu import _blocking, _private, _process, exceptions
from substrate_gpu.runsc import api, argv, errors, roots, stragglers
from substrate_gpu.runsc import argv as _command_lines  # ``exec``'s parameter shadows ``argv``


@dataclass(frozen=True)
class Timeouts:
    """Seconds each runsc operation may take before its process group is killed."""

    create: float = 120.0
    """``create``: boots the sandbox (sentry, gofer, nvproxy)."""
    start: float = 30.0
    """``start``: starts the container's init in an existing sandbox."""
    checkpoint: float = 600.0
    """``checkpoint``: writes the whole sandbox memory to the image."""
    restore: float = 600.0
    """``restore``: boots a sandbox and reads the whole image back."""
    state: float = 10.0
    """``state``: reads runsc's metadata."""
    kill: float = 10.0
    """``kill``: signals the container."""
    delete: float = 60.0
    """``delete``: tears the sandbox down."""
    pause: float = 30.0
    """``pause`` and ``resume``: freeze and thaw the sandbox (upstream's resume ceiling)."""
    exec: float = 60.0
    """``exec``: a command run inside the sandbox (``cuda-checkpoint``), unless the caller
    gives its own timeout."""
    detect: float = 10.0
    """``--version``, ``help``, ``flags``, ``nvproxy list-supported-drivers``."""


@dataclass(frozen=True)
class RunscConfig:
    """How to run runsc on this node."""

    root: Path
    """``--root``: runsc's state directory."""
    runsc: str = "runsc"
    """The runsc executable (path, or a name on PATH)."""
    global_flags: tuple[str, ...] = ()
    """Extra global flags on every container command (``--platform=systrap``)."""
    nvproxy_flags: tuple[str, ...] = ()
    """Extra global flags that travel with ``--nvproxy`` only
    (``--nvproxy-driver-version=550.90.07``)."""
    timeouts: Timeouts = field(default_factory=Timeouts)
    """Per-operation timeouts."""
    pid_dir: Path | None = None
    """Where ``create`` writes ``<id>.pid``; ``None``: ``<bundle>/runsc.pid``."""
    container_output: api.ContainerOutputs | None = None
    """Where app containers' stdio goes, for a multi-container sandbox (:meth:`RunscDriver.
    for_actor`): ``create`` and ``restore`` of each container but ``_pause`` get its pipe as
    their stdout and stderr (runsc's own messages come back from it). None: a file of the
    command, as for every other command."""
    upstream_worker_flags: bool = False
    """Pass what upstream's gVisor worker passes where this runsc has it:
    ``--cpu-num-from-quota`` on ``create`` and ``restore`` (the sentry's vCPUs from the
    sandbox's CPU quota), ``--allow-connected-on-save`` on ``start``."""

    @property
    def invocation(self) -> argv.Invocation:
        """The argv builders' view of this config."""
        return argv.Invocation(
            runsc=self.runsc,
            root=self.root,
            global_flags=self.global_flags,
            nvproxy_flags=self.nvproxy_flags,
        )


_PAUSE = "_pause"
"""The sandbox's root container: its output is never piped (upstream gives it the worker's)."""

_STATUSES: frozenset[str] = frozenset(get_args(api.ContainerStatus))

#: runsc's own refusals to exec (as opposed to the exec'd command failing): the container
#: cannot be loaded, or is not running. Anchored on runsc's wording so a command that
#: merely prints "not found" is not mistaken for runsc failing.
_RUNSC_OWN_FAILURE = re.compile(
    r"^(?:(?:FetchSpec failed: )?loading container: "
    r"|executing processes for container: "
    r"|.*cannot execute in container \"[^\"]*\" in state )",
    re.IGNORECASE | re.MULTILINE,
)


def parse_state(container_id: str, stdout: str) -> api.ContainerState:
    """Parse ``runsc state`` JSON (``id``, ``status``, ``pid``, ``bundle``).

    Raises :class:`~substrate_gpu.runsc.api.RunscError` naming the container and the field
    when the output is not the JSON runsc documents.
    """

    def bad(problem: str) -> api.RunscError:
        return api.RunscError(
            f"while querying the state of container {container_id}: runsc state printed "
            f"{problem}: {_process.tail(stdout, 300) or '(nothing)'}",
            argv=(),
            returncode=0,
            stderr="",
        )

    try:
        raw: object = json.loads(stdout)
    except json.JSONDecodeError as e:
        raise bad(f"invalid JSON ({e.msg} at line {e.lineno} column {e.colno})") from e
    if not isinstance(raw, dict):
        raise bad("JSON that is not an object")
    payload = cast("dict[str, object]", raw)
    cid, status, pid, bundle = (payload.get(k) for k in ("id", "status", "pid", "bundle"))
    if not isinstance(cid, str) or not cid:
        raise bad("no string 'id'")
    if not isinstance(status, str) or status not in _STATUSES:
        raise bad(f"an unknown 'status' {status!r} (expected one of {sorted(_STATUSES)})")
    # runsc reports a stopped container's pid as -1 (runc as 0): both mean "no process".
    if isinstance(pid, bool) or not isinstance(pid, int) or pid < -1:
        raise bad(f"an invalid 'pid' {pid!r}")
    pid = max(pid, 0)
    if not isinstance(bundle, str):
        raise bad("no string 'bundle'")
    return api.ContainerState(
        id=cid, status=cast("api.ContainerStatus", status), pid=pid, bundle=bundle
    )


def parse_driver_list(stdout: str) -> tuple[str, ...]:
    """``runsc nvproxy list-supported-drivers`` output: one version a line, gVisor's
    *supported* tier only (known-but-unqualified ABIs are not listed)."""
    return tuple(ln.strip() for ln in stdout.splitlines() if ln.strip())


def has_flag(help_text: str, flag: str) -> bool:
    """Whether runsc's help text lists ``flag`` (``-leave-running``)."""
    # Go's flag.PrintDefaults lists "  -name type" (one dash); accept two for other printers.
    return re.search(rf"(?m)^\s*--?{re.escape(flag)}\b", help_text) is not None


def has_command(help_text: str, command: str) -> bool:
    """Whether runsc's help text lists the subcommand ``command``."""
    # subcommands.ExplainGroup lists "\t<name>  <synopsis>".
    return re.search(rf"(?m)^\s+{re.escape(command)}\b", help_text) is not None


#: Function names a Go binary keeps in its symbol table (pclntab) even when stripped, which
#: tell whether a runsc build has google/gvisor#14525 ("Create nvproxy device files on
#: restore regardless of remap metadata"): the fix adds ``(*Loader).
#: createNvproxyDeviceFilesAfterRestore`` and removes the remap-gated
#: ``(*Loader).createRemappedNvproxyDeviceFiles`` (``runsc/boot/nvproxy.go``).
RESTORE_DEVICE_FILES_FIXED = b"boot.(*Loader).createNvproxyDeviceFilesAfterRestore"
RESTORE_DEVICE_FILES_REMAP_GATED = b"boot.(*Loader).createRemappedNvproxyDeviceFiles"
_MARKERS = (RESTORE_DEVICE_FILES_FIXED, RESTORE_DEVICE_FILES_REMAP_GATED)


@dataclass(frozen=True)
class BinaryFacts:
    """What reading the runsc executable itself tells (one pass over it)."""

    sha256: str
    """Its SHA-256; empty when it cannot be read."""
    markers: frozenset[bytes]
    """Which of the known symbol names (:data:`_MARKERS`) it contains."""

    @property
    def restore_creates_gpu_device_files(self) -> bool | None:
        """See :attr:`~substrate_gpu.runsc.api.RunscFeatures.restore_creates_gpu_device_files`."""
        if RESTORE_DEVICE_FILES_FIXED in self.markers:
            return True
        if RESTORE_DEVICE_FILES_REMAP_GATED in self.markers:
            return False
        return None


def scan_binary(runsc: str) -> BinaryFacts:
    """Hash the ``runsc`` executable (a path, or a name on PATH) and look for the symbol
    names of :data:`_MARKERS` in it, in one read; nothing found when it cannot be read (a
    missing binary fails its ``--version`` first, with its own message)."""
    path = shutil.which(runsc) or runsc
    digest = hashlib.sha256()
    found: set[bytes] = set()
    overlap = max(len(m) for m in _MARKERS) - 1
    tail = b""
    try:
        with Path(path).open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
                window = tail + block
                found.update(m for m in _MARKERS if m not in found and m in window)
                tail = window[-overlap:]
    except OSError:
        return BinaryFacts(sha256="", markers=frozenset())
    return BinaryFacts(sha256=digest.hexdigest(), markers=frozenset(found))


def nvproxy_flag_is_legacy(flags_help: str) -> bool:
    """Whether ``runsc flags`` describes ``-nvproxy`` as ``LEGACY`` (its usage line follows
    the flag's line, as Go's ``flag.PrintDefaults`` prints it)."""
    match = re.search(r"(?m)^\s*--?nvproxy\n\s*(.*)$", flags_help)
    return match is not None and match.group(1).lstrip().startswith("LEGACY")


class RunscDriver:
    """:class:`~substrate_gpu.runsc.api.SandboxRuntime` over the runsc binary."""

    def __init__(self, config: RunscConfig, *, parent: RunscDriver | None = None) -> None:
        self.config = config
        self._inv = config.invocation
        self._features: api.RunscFeatures | None = None
        self._features_lock = anyio.Lock()
        self._parent = parent
        """The driver this one was made from (:meth:`for_actor`, :meth:`for_binary`): it
        holds the caches, so features are detected once for all actors of a binary."""
        self._sandbox: str | None = None
        """The actor this driver's root is (:meth:`for_actor`); None: the agent's root."""
        self._digests: dict[tuple[str, int, int, int, int], str] = {}
        """Path and its stat -> SHA-256 (the top driver's)."""
        self._by_digest: dict[str, api.RunscFeatures] = {}
        """A binary's SHA-256 -> its detected features (the top driver's)."""
        self._drivers_by_digest: dict[str, tuple[str, ...]] = {}
        """A binary's SHA-256 -> its supported-driver list (the top driver's)."""

    @property
    def _top(self) -> RunscDriver:
        return self._parent or self

    def for_actor(self, actor_id: str) -> RunscDriver:
        """This driver with ``--root <root>/<actor_id>``: a multi-container sandbox's own
        root (its container names repeat across actors). A ``pid_dir`` gets the same
        sub-directory, for the same reason. The binary stays this driver's."""
        config = dataclasses.replace(
            self.config,
            root=self.config.root / actor_id,
            pid_dir=None if self.config.pid_dir is None else self.config.pid_dir / actor_id,
        )
        child = RunscDriver(config, parent=self._top)
        child._sandbox = actor_id
        return child

    def for_binary(self, runsc: str) -> RunscDriver:
        """This driver running ``runsc`` (root, flags and timeouts kept): a staged binary,
        whose features and supported drivers are its own (cached by its SHA-256)."""
        return RunscDriver(dataclasses.replace(self.config, runsc=runsc), parent=self._top)

    @property
    def _own_binary(self) -> bool:
        """Runs another binary than the driver it came from (:meth:`for_binary`)."""
        return self._parent is not None and self.config.runsc != self._parent.config.runsc

    async def binary_digest(self) -> str:
        """The SHA-256 of this driver's binary ('' when it cannot be read), hashed once per
        path while the file stats the same, in a thread."""
        path = shutil.which(self.config.runsc) or self.config.runsc
        try:
            info = Path(path).stat()
        except OSError:
            return ""
        key = (path, info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)
        digests = self._top._digests
        if key not in digests:
            digest = await _blocking.run_abandonable(
                lambda: scan_binary(path).sha256, name="runsc-sha256"
            )
            if not digest:
                return ""
            digests[key] = digest
        return digests[key]

    def has_root(self) -> bool:
        """Whether this driver's root (or its pid-file directory) is there."""
        paths = [self.config.root, *([self.config.pid_dir] if self.config.pid_dir else [])]
        return any(os.path.lexists(p) for p in paths)

    async def remove_root(self) -> None:
        """Unmount what runsc left under this actor's own root (its ``null-netns``), then
        remove the root and the actor's pid-file directory (:mod:`.roots`; in a thread).

        Only for a root :meth:`for_actor` gave, once none of its containers is left: the
        agent's own root holds every other actor's. Raises
        :class:`~substrate_gpu.runsc.roots.RootRemovalError` naming what stays.
        """
        if self._parent is None:
            raise ValueError(
                f"refusing to remove {self.config.root}: it is the agent's runsc root, not "
                "one actor's (RunscDriver.for_actor)"
            )
        doomed = [self.config.root]
        if self.config.pid_dir is not None:
            doomed.append(self.config.pid_dir)

        def remove_all() -> None:
            for path in doomed:
                roots.remove(path)

        await _blocking.run_abandonable(remove_all, name="substrate-gpu runsc root")

    async def _run(
        self,
        args: tuple[str, ...],
        *,
        timeout: float,
        doing: str,
        umask: int = -1,
        output: _process.CommandOutput | None = None,
    ) -> _process.CommandResult:
        try:
            return await _process.run_command(
                args,
                timeout=timeout,
                what=doing,
                umask=umask,
                die_with_parent=True,
                output=output,
            )
        except exceptions.ExternalCommandError as e:
            raise errors.from_command_error(e) from e

    async def reap_stragglers(self, timeout: float = 10.0) -> tuple[int, ...]:
        """Kill every runsc command under this driver's root (actors' roots included) that
        a killed agent left running, and wait up to ``timeout`` seconds until each is gone;
        the pids killed. A :class:`~substrate_gpu.runsc.api.RunscError` names any still
        alive then (recovery must not decide while one may still land)."""
        root = self.config.root

        def reap() -> tuple[tuple[int, ...], tuple[int, ...]]:
            found = stragglers.find(root)
            return found, stragglers.kill(found, timeout=timeout) if found else ()

        found, left = await _blocking.run_abandonable(reap, name="substrate-gpu runsc reap")
        if left:
            raise api.RunscError(
                f"while killing the runsc commands a killed agent left under {root}: "
                f"pid(s) {', '.join(map(str, left))} still alive after {timeout:g}s",
                argv=(),
                returncode=None,
                stderr="",
            )
        return found

    # -- feature detection --------------------------------------------------------------

    async def features(self) -> api.RunscFeatures:
        """Detect (once, then cached) what this runsc supports; a staged binary's
        (:meth:`for_binary`), once per SHA-256."""
        if self._own_binary:
            return await self._features_of_binary()
        if self._parent is not None:
            return await self._parent.features()
        if self._features is not None:
            return self._features
        async with self._features_lock:
            if self._features is None:
                self._features = await self._detect()
                if self._features.binary_sha256:
                    self._by_digest[self._features.binary_sha256] = self._features
            return self._features

    async def _features_of_binary(self) -> api.RunscFeatures:
        top = self._top
        digest = await self.binary_digest()
        found = top._by_digest.get(digest) if digest else None
        if found is not None:
            return found
        async with top._features_lock:
            found = top._by_digest.get(digest) if digest else None
            if found is None:
                found = await self._detect()
                if found.binary_sha256:
                    top._by_digest[found.binary_sha256] = found
            return found

    async def _detect(self) -> api.RunscFeatures:
        timeout = self.config.timeouts.detect
        doing = f"detecting the features of {self.config.runsc}"
        version = await self._run(argv.version(self._inv), timeout=timeout, doing=doing)
        first_line = next((ln.strip() for ln in version.stdout.splitlines() if ln.strip()), "")
        if not first_line:
            raise api.RunscError(
                f"while {doing}: '{self.config.runsc} --version' printed nothing; is this runsc?",
                argv=version.argv,
                returncode=version.returncode,
                stderr=version.stderr,
            )
        # help output goes to stdout on success; an unknown topic exits 2. Neither is fatal:
        # a flag we cannot see is a flag we do not use.
        checkpoint_help = await self._help_text(argv.help_command(self._inv, "checkpoint"))
        commands_help = await self._help_text(argv.help_command(self._inv))
        flags_help = await self._help_text(argv.top_level_flags(self._inv))
        binary = await _blocking.run_abandonable(
            lambda: scan_binary(self.config.runsc), name="runsc-sha256"
        )
        restore_help = await self._help_text(argv.help_command(self._inv, "restore"))
        return api.RunscFeatures(
            version=first_line,
            leave_running=has_flag(checkpoint_help, "leave-running"),
            cuda_checkpoint_path=has_flag(checkpoint_help, "cuda-checkpoint-path"),
            nvproxy_driver_version=has_flag(flags_help, "nvproxy-driver-version"),
            list_supported_drivers=has_command(commands_help, "nvproxy"),
            cuda_checkpoint_sequential=has_flag(checkpoint_help, "cuda-checkpoint-sequential"),
            cpu_num_from_quota=has_flag(flags_help, "cpu-num-from-quota"),
            allow_connected_on_save=has_flag(flags_help, "allow-connected-on-save"),
            binary_sha256=binary.sha256,
            restore_creates_gpu_device_files=binary.restore_creates_gpu_device_files,
            nvproxy_flag_legacy=nvproxy_flag_is_legacy(flags_help),
            restore_background=has_flag(restore_help, "background"),
        )

    async def _help_text(self, args: tuple[str, ...]) -> str:
        try:
            result = await _process.run_command(
                args,
                timeout=self.config.timeouts.detect,
                what=f"detecting the features of {self.config.runsc}",
                check=False,
                die_with_parent=True,
            )
        except exceptions.ExternalCommandError as e:
            raise errors.from_command_error(e) from e
        return result.stdout + "\n" + result.stderr

    async def list_supported_drivers(self) -> tuple[str, ...]:
        """The NVIDIA driver versions this runsc's nvproxy supports, as runsc lists them.

        Raises :class:`~substrate_gpu.runsc.api.RunscError` when this runsc has no
        ``nvproxy list-supported-drivers`` (upgrade runsc, or pin the driver ABI with
        ``--nvproxy-driver-version``).
        """
        args = argv.list_supported_drivers(self._inv)
        doing = f"listing the NVIDIA drivers supported by {self.config.runsc}"
        if not (await self.features()).list_supported_drivers:
            raise api.RunscError(
                f"while {doing}: this runsc has no 'nvproxy list-supported-drivers' command; "
                "upgrade runsc or check the driver against gVisor's release notes",
                argv=args,
                returncode=None,
                stderr="",
            )
        digest = (await self.features()).binary_sha256
        cached = self._top._drivers_by_digest.get(digest) if digest else None
        if cached is not None:
            return cached
        result = await self._run(args, timeout=self.config.timeouts.detect, doing=doing)
        listed = parse_driver_list(result.stdout)
        if digest and listed:
            self._top._drivers_by_digest[digest] = listed
        return listed

    # -- container lifecycle --------------------------------------------------------------

    async def _upstream_flags(self, command: str) -> tuple[str, ...]:
        """The global flags upstream's worker gives ``command`` that this runsc has (none
        unless ``upstream_worker_flags``). A runsc whose features cannot be detected gets
        none: the command itself then says what is wrong with it."""
        if not self.config.upstream_worker_flags:
            return ()
        try:
            features = await self.features()
        except api.RunscError:
            return ()
        if command in {"create", "restore"}:
            return ("--cpu-num-from-quota",) if features.cpu_num_from_quota else ()
        if command == "start":
            return ("--allow-connected-on-save",) if features.allow_connected_on_save else ()
        return ()

    async def _restore_background(self) -> bool:
        """``restore --background`` as upstream's worker gives it (``restoreArgs`` at
        533900d), where this runsc has it and ``upstream_worker_flags`` is on: restore
        answers once the sandbox runs, its memory still loading (docs/worker-api.md,
        Performance)."""
        if not self.config.upstream_worker_flags:
            return False
        try:
            return (await self.features()).restore_background
        except api.RunscError:
            return False

    def pid_file(self, container_id: str, bundle: Path) -> Path:
        """Where ``create`` asks runsc to write the sandbox pid."""
        if self.config.pid_dir is None:
            return bundle / "runsc.pid"
        return self.config.pid_dir / f"{container_id}.pid"

    async def create(self, container_id: str, bundle: Path, *, nvproxy: bool) -> None:
        """``runsc --root R [--nvproxy] create --bundle B --pid-file P ID``.

        Pass ``nvproxy=True`` for every container of a GPU sandbox, the pause container too.
        """
        args = argv.create(
            self._inv,
            container_id,
            bundle=bundle,
            pid_file=self.pid_file(container_id, bundle),
            nvproxy=nvproxy,
            extra=await self._upstream_flags("create"),
        )
        try:
            await self._run(
                args,
                timeout=self.config.timeouts.create,
                doing=f"creating container {container_id}",
                output=self._output_of(container_id, fresh=True),
            )
        except BaseException:
            self._release_output(container_id)  # no start follows
            raise

    def _output_of(self, container_id: str, *, fresh: bool) -> _process.CommandOutput | None:
        """The app container's stdio pipe (``RunscConfig.container_output``), if any."""
        outputs = self.config.container_output
        if outputs is None or self._sandbox is None or container_id == _PAUSE:
            return None
        return outputs.open(self._sandbox, container_id, fresh=fresh)

    def _release_output(self, container_id: str) -> None:
        if self.config.container_output is not None and self._sandbox is not None:
            self.config.container_output.release(self._sandbox, container_id)

    async def start(self, container_id: str) -> None:
        """``runsc --root R start ID``."""
        try:
            await self._run(
                argv.start(self._inv, container_id, extra=await self._upstream_flags("start")),
                timeout=self.config.timeouts.start,
                doing=f"starting container {container_id}",
                output=self._output_of(container_id, fresh=False),
            )
        finally:
            self._release_output(container_id)

    async def checkpoint(
        self,
        container_id: str,
        image_path: Path,
        *,
        leave_running: bool,
        cuda_checkpoint_path: Path | None = None,
        cuda_checkpoint_sequential: bool = False,
    ) -> None:
        """``runsc --root R checkpoint --image-path DIR [--leave-running] ID``
        (``--cuda-checkpoint-path P [--cuda-checkpoint-sequential]`` on the runsc route).

        Without ``leave_running`` a *successful* checkpoint stops the sandbox (it stays
        ``stopped`` until deleted), and so does a *failed* one. Use a fresh ``image_path``
        per attempt: runsc refuses to overwrite an existing ``checkpoint.img``.

        runsc runs with umask 077 (its own, not the agent's): the image is the sandbox's
        memory, and runsc creates its files 0644 and a missing directory 0755 less the
        umask, so they are 0600 and 0700 from the first byte (:mod:`substrate_gpu._private`).
        """
        await self._run(
            argv.checkpoint(
                self._inv,
                container_id,
                image_path=image_path,
                leave_running=leave_running,
                cuda_checkpoint_path=cuda_checkpoint_path,
                cuda_checkpoint_sequential=cuda_checkpoint_sequential,
            ),
            timeout=self.config.timeouts.checkpoint,
            doing=f"checkpointing container {container_id}",
            umask=_private.UMASK,
        )

    async def restore(
        self, container_id: str, bundle: Path, image_path: Path, *, nvproxy: bool
    ) -> None:
        """``runsc --root R [--nvproxy] restore --bundle B --image-path DIR --detach ID``.

        Pass ``nvproxy=True`` for every container of a GPU sandbox, the pause container too.
        """
        args = argv.restore(
            self._inv,
            container_id,
            bundle=bundle,
            image_path=image_path,
            nvproxy=nvproxy,
            extra=await self._upstream_flags("restore"),
            background=await self._restore_background(),
        )
        try:
            await self._run(
                args,
                timeout=self.config.timeouts.restore,
                doing=f"restoring container {container_id}",
                output=self._output_of(container_id, fresh=True),
            )
        finally:
            self._release_output(container_id)

    async def state(self, container_id: str) -> api.ContainerState:
        """``runsc --root R state ID``, parsed."""
        result = await self._run(
            argv.state(self._inv, container_id),
            timeout=self.config.timeouts.state,
            doing=f"querying the state of container {container_id}",
        )
        return parse_state(container_id, result.stdout)

    async def exec(
        self,
        container_id: str,
        argv: Sequence[str],
        timeout: float | None = None,
        *,
        detach: bool = False,
    ) -> _process.CommandResult:
        """``runsc --root R exec [--detach] ID CMD…``: run a command inside the sandbox.

        The command's exit status and output are **returned, not judged**: runsc exec exits
        with the command's status, and only the caller knows what a non-zero status of its
        command means (``cuda-checkpoint`` reports a failed lock that way). Raises
        :class:`~substrate_gpu.runsc.api.RunscError` only when runsc itself could not run
        the command — the container is unknown or stopped (runsc's own messages, typed as
        usual), runsc cannot be started, or the call outlives ``timeout`` seconds
        (default ``Timeouts.exec``; the process group is killed).
        """
        args = _command_lines.exec_(self._inv, container_id, argv, detach=detach)
        doing = f"running {argv[0] if argv else '(nothing)'} in container {container_id}"
        result = await self._run_unchecked(
            args, timeout=self.config.timeouts.exec if timeout is None else timeout, doing=doing
        )
        if result.returncode != 0 and _RUNSC_OWN_FAILURE.search(result.stderr):
            raise errors.error_class(result.stderr)(
                f"while {doing}: runsc exited with status {result.returncode}; "
                f"stderr: {_process.tail(result.stderr) or '(empty)'}",
                argv=result.argv,
                returncode=result.returncode,
                stderr=result.stderr,
            )
        return result

    async def _run_unchecked(
        self, args: tuple[str, ...], *, timeout: float, doing: str
    ) -> _process.CommandResult:
        try:
            return await _process.run_command(
                args, timeout=timeout, what=doing, check=False, die_with_parent=True
            )
        except exceptions.ExternalCommandError as e:
            raise errors.from_command_error(e) from e

    async def kill(self, container_id: str, signal: str = "KILL") -> None:
        """``runsc --root R kill ID SIGNAL``."""
        await self._run(
            argv.kill(self._inv, container_id, signal),
            timeout=self.config.timeouts.kill,
            doing=f"sending {signal} to container {container_id}",
        )

    async def pause(self, container_id: str) -> None:
        """``runsc --root R pause ID`` (of ``_pause``: every process of the sandbox)."""
        await self._run(
            argv.pause(self._inv, container_id),
            timeout=self.config.timeouts.pause,
            doing=f"pausing container {container_id}",
        )

    async def resume(self, container_id: str) -> None:
        """``runsc --root R resume ID``."""
        await self._run(
            argv.resume(self._inv, container_id),
            timeout=self.config.timeouts.pause,
            doing=f"resuming container {container_id}",
        )

    async def delete(self, container_id: str, *, force: bool = False) -> None:
        """``runsc --root R delete [--force] ID``."""
        await self._run(
            argv.delete(self._inv, container_id, force=force),
            timeout=self.config.timeouts.delete,
            doing=f"deleting container {container_id}",
        )
