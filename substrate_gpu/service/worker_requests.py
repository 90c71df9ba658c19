"""From a worker API request to what our machine is told: checks, GPUs, sizing.

Pure where it can be: :func:`check_uid`, :func:`check_containers` and :func:`sized` work on
values; :func:`read_workload` and :func:`edit_configs` read and write the bundles atelet
prepared, confined to ``actor_dirs.oci_bundle_dir`` (:mod:`substrate_gpu._bundle`: a link
anywhere under it, or a FIFO for a config.json, is refused at once) and in a thread (the
servicer runs them off the event loop). Every refusal is a :class:`BadRequest` naming the
request field (or the file) at fault, which the servicer answers with ``INVALID_ARGUMENT``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import re
import stat
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from google.protobuf import descriptor, message

from substrate_gpu import _bundle, exceptions
from substrate_gpu.cdi import names
from substrate_gpu.lifecycle import events, sandbox

PAUSE: Final = events.PAUSE_CONTAINER
"""The sandbox's root container, implied by every request (upstream's ``PauseContainer``)."""

#: An actor UID becomes part of our activation ids (``<uid>.<n>``), so runsc container and
#: directory names: the characters an actor id may hold, short enough for the suffix.
UID: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,100}")
#: The CDI convention for device requests in an OCI config: ``cdi.k8s.io/<any key>`` =
#: a comma-separated list of fully qualified device names.
CDI_ANNOTATION_PREFIX: Final = "cdi.k8s.io/"
#: The cgroup v2 ``cpu.max`` period the CPU quota is expressed against (the kernel's default).
CPU_PERIOD_USEC: Final = 100_000
#: Where a sandbox's cgroup goes when its root bundle names none (see :func:`edit_configs`).
CGROUP_PARENT: Final = "/substrate-gpu"


#: Every directory of ``ActorDirs``, each required (upstream's ``resources.ValidateActorDirs``).
ACTOR_DIRS: Final = (
    "root_dir",
    "oci_bundle_dir",
    "checkpoint_dir",
    "restore_dir",
    "durable_dir_volume_mounts_dir",
    "system_info_volume_roots_dir",
    "volumes_dir",
)

#: The identity strings every request carries (kept on the actor, in the event log, echoed
#: in stats samples). Kubernetes names are at most 253 bytes and UIDs 36: 1 KiB each is room
#: to spare, and five of them stay far inside the JSON door's 64 KiB line.
IDENTITY_FIELDS: Final = (
    "atespace",
    "actor_name",
    "actor_uid",
    "actor_template_atespace",
    "actor_template_name",
)
IDENTITY_BYTES_MAX: Final = 1024
#: Any other string of a request (paths, container and volume names): a path's bound on
#: Linux (``PATH_MAX``, 4096 bytes with its NUL).
STRING_BYTES_MAX: Final = 4096


class BadRequest(exceptions.SubstrateGpuError):
    """A request field (or a file it points at) is not usable: INVALID_ARGUMENT."""


def check_sizes(request: message.Message) -> None:
    """Refuse a request with a string over its bound, naming the field and the bound (never
    the value: the refusal is logged). Before anything else reads the request."""
    for where, value in _strings(request, ""):
        bound = IDENTITY_BYTES_MAX if where in IDENTITY_FIELDS else STRING_BYTES_MAX
        if len(value) * 4 <= bound:
            continue  # at most 4 bytes a character: within its bound, not encoded
        size = len(value.encode("utf-8", "surrogatepass"))
        if size > bound:
            kind = "an identity string" if bound == IDENTITY_BYTES_MAX else "a string"
            raise BadRequest(f"{where} is {size} bytes: at most {bound} ({kind}) is accepted")


@functools.cache
def _is_map_entry(message_type: descriptor.Descriptor) -> bool:
    # GetOptions builds an options message per call: asked once per message type.
    return bool(message_type.GetOptions().map_entry)


def _strings(msg: message.Message, prefix: str) -> Iterator[tuple[str, str]]:
    """Every string set in ``msg`` (nested messages, lists and maps included), by field path."""
    for field, value in msg.ListFields():
        where = f"{prefix}{field.name}"
        entry_type = field.message_type
        if entry_type is not None and _is_map_entry(entry_type):
            value_field = entry_type.fields_by_name["value"]
            for key, item in value.items():
                entry = f"{where}[{key[:64]!r}]" if isinstance(key, str) else f"{where}[{key}]"
                if isinstance(key, str):
                    yield f"{where} key", key
                if value_field.type == descriptor.FieldDescriptor.TYPE_MESSAGE:
                    yield from _strings(item, f"{entry}.")
                elif isinstance(item, str):
                    yield entry, item
            continue
        items = list(value) if field.is_repeated else [value]
        for i, item in enumerate(items):
            at = f"{where}[{i}]" if field.is_repeated else where
            if isinstance(item, message.Message):
                yield from _strings(item, f"{at}.")
            elif isinstance(item, str):
                yield at, item


@dataclass(frozen=True)
class Workload:
    """What a Run or Restore request asks of our machine."""

    containers: tuple[str, ...]
    """The app containers, in order (``_pause`` implied)."""
    bundle_dir: Path
    """``actor_dirs.oci_bundle_dir``: one bundle per container, ``_pause`` included."""
    gpu_names: tuple[str, ...]
    """The CDI devices the app containers' configs request (empty: none requested)."""
    container_gpus: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    """App container -> the devices its own config requests, for the containers that
    request any (empty when none does): each app container gets exactly its own."""
    runsc: str = ""
    """The staged runsc the sandbox runs under (:func:`check_runsc_path`); empty: the
    agent's own (``--runsc``)."""


def check_uid(uid: str, field: str = "actor_uid") -> str:
    """``uid`` when it can name an actor here; a :class:`BadRequest` naming ``field``."""
    if not uid:
        raise BadRequest(f"{field} is required")
    if not UID.fullmatch(uid):
        raise BadRequest(
            f"{field} {uid!r} is not usable as an actor id here: 1-101 characters of "
            "[A-Za-z0-9_.-], starting with a letter or digit"
        )
    return uid


def is_clean_absolute(path: str) -> bool:
    """``path`` is absolute and already clean: what Go's ``filepath.Clean`` leaves alone
    (no ``.``, ``..``, empty or trailing components; one leading ``/``)."""
    return path.startswith("/") and not path.startswith("//") and os.path.normpath(path) == path


def check_actor_dirs(dirs: object | None, field: str = "actor_dirs") -> None:
    """Every ``ActorDirs`` directory set, absolute and clean, as upstream's worker checks them
    before anything else (``resources.ValidateActorDirs``); one :class:`BadRequest` naming
    each field at fault, in upstream's words (``actor_dirs.volumes_dir: Required value``)."""
    if dirs is None:
        raise BadRequest(f"{field}: Required value")
    problems = []
    for name in ACTOR_DIRS:
        value = getattr(dirs, name)
        if not isinstance(value, str) or not value:
            problems.append(f"{field}.{name}: Required value")
        elif not is_clean_absolute(value):
            problems.append(
                f'{field}.{name}: Invalid value: "{value}": must be an absolute, clean path'
            )
    if problems:
        # k8s' field.ErrorList aggregate: one error as is, several in brackets.
        raise BadRequest(problems[0] if len(problems) == 1 else f"[{', '.join(problems)}]")


def check_containers(names_: Sequence[str]) -> tuple[str, ...]:
    """The app container names of ``spec.containers``, checked (order kept). None is fine:
    the sandbox is ``_pause`` alone, as upstream's worker runs it."""
    seen: set[str] = set()
    for i, name in enumerate(names_):
        where = f"spec.containers[{i}].name"
        if name == PAUSE:
            raise BadRequest(f"{where} is {PAUSE!r}: the sandbox's root, implied, never listed")
        if not events.CONTAINER_NAME.fullmatch(name):
            raise BadRequest(
                f"{where} {name!r} is not a container name: 1-63 characters of "
                "[A-Za-z0-9_.-], starting with a letter or digit"
            )
        if name in seen:
            raise BadRequest(f"{where} {name!r} is listed twice")
        seen.add(name)
    return tuple(names_)


def check_dir(path: str, field: str) -> Path:
    """``path`` as an existing absolute directory; a :class:`BadRequest` naming ``field``."""
    if not path:
        raise BadRequest(f"{field} is required")
    directory = Path(path)
    if not directory.is_absolute():
        raise BadRequest(f"{field} {path!r} is not an absolute path")
    if not directory.is_dir():
        raise BadRequest(f"{field} {path!r} is not a directory")
    return directory


def check_runsc_path(path: str, static_dir: Path, field: str = "runsc_path") -> str:
    """``path`` when atelet may have staged it: an absolute, clean path strictly inside
    ``static_dir`` (``--runsc-static-dir``, upstream's ``nodepath.StaticFilesDir``), reached
    through no symbolic link (``static_dir``'s own components included), naming a regular
    file that is executable; "" for "" (the agent's own runsc). As upstream's
    ``resources.ValidateRuntimeAssetPath`` (the worker runs it as root), plus the execute
    bit; a :class:`BadRequest` naming ``field`` and what is wrong otherwise."""
    if not path:
        return ""
    where = f"{field} {path!r}"
    if not Path(path).is_absolute() or os.path.normpath(path) != path:
        raise BadRequest(f"{where} must be an absolute, clean path (no '.', '..' or '//')")
    root = os.path.normpath(str(static_dir))
    if os.path.commonpath([root, path]) != root or path == root:
        raise BadRequest(
            f"{where} must be inside {root} (--runsc-static-dir), where atelet stages runsc"
        )
    try:
        resolved = str(Path(path).resolve(strict=True))
        info = Path(path).stat()
    except OSError as e:
        raise BadRequest(f"{where}: {e.strerror or e}") from e
    if resolved != path:
        raise BadRequest(f"{where} must not traverse a symbolic link (it resolves to {resolved})")
    if not stat.S_ISREG(info.st_mode):
        raise BadRequest(f"{where} must be a regular file")
    if not info.st_mode & 0o111 or not os.access(path, os.X_OK):
        raise BadRequest(f"{where} must be executable (mode {stat.S_IMODE(info.st_mode):04o})")
    return path


def read_workload(bundle_dir: str, container_names: Sequence[str]) -> Workload:
    """Check every bundle of the sandbox exists and read the app containers' CDI requests.

    Blocks (file I/O: run it in a thread); each container's directory must be a real one of
    the bundle directory and its config.json a regular file (:mod:`substrate_gpu._bundle`).
    """
    root = check_dir(bundle_dir, "actor_dirs.oci_bundle_dir")
    containers = check_containers(container_names)
    _read_config(root, PAUSE)
    requested: dict[str, None] = {}
    per_container: dict[str, tuple[str, ...]] = {}
    for name in containers:
        config = _read_config(root, name)
        own = dict.fromkeys(cdi_requests(config, root / name / _bundle.CONFIG))
        if own:
            per_container[name] = tuple(own)
        requested.update(own)
    return Workload(
        containers=containers,
        bundle_dir=root,
        gpu_names=tuple(requested),
        container_gpus=per_container,
    )


def cdi_requests(config: Mapping[str, object], where: Path) -> list[str]:
    """The devices ``config``'s ``cdi.k8s.io/*`` annotations request, in order (checked)."""
    annotations = config.get("annotations")
    if not isinstance(annotations, dict):
        return []
    found: list[str] = []
    for key, value in annotations.items():
        if not (isinstance(key, str) and key.startswith(CDI_ANNOTATION_PREFIX)):
            continue
        if not isinstance(value, str):
            raise BadRequest(f"{where}: annotation {key!r} is not a string")
        for item in value.split(","):
            device = item.strip()
            if not device:
                continue
            try:
                names.parse_qualified_name(device)
            except exceptions.DeviceRequestError as e:
                raise BadRequest(f"{where}: annotation {key!r}: {e}") from e
            found.append(device)
    return found


def sized(config: dict[str, object], cpu_milli: int, memory_bytes: int, cgroup: str) -> str:
    """Write the actor's size into the root container's ``config`` (in place), as upstream
    does: ``linux.resources`` (a CPU quota of ``cpu_milli`` per 1000 over
    :data:`CPU_PERIOD_USEC`, a memory limit), which runsc applies to the sandbox's cgroup. A
    config naming no ``linux.cgroupsPath`` is given ``cgroup``, so the sandbox has a cgroup
    of its own to be sized and measured by. 0 (or less) leaves a limit unset. Returns the
    sandbox's cgroup path."""
    linux = config.setdefault("linux", {})
    if not isinstance(linux, dict):
        raise BadRequest(f"{PAUSE}/config.json: linux is not an object")
    path = linux.setdefault("cgroupsPath", cgroup)
    if not isinstance(path, str):
        raise BadRequest(f"{PAUSE}/config.json: linux.cgroupsPath is not a string")
    if cpu_milli > 0 or memory_bytes > 0:
        resources = linux.setdefault("resources", {})
        if not isinstance(resources, dict):
            raise BadRequest(f"{PAUSE}/config.json: linux.resources is not an object")
        if cpu_milli > 0:
            cpu = resources.setdefault("cpu", {})
            if isinstance(cpu, dict):
                cpu["period"] = CPU_PERIOD_USEC
                cpu["quota"] = cpu_milli * CPU_PERIOD_USEC // 1000
        if memory_bytes > 0:
            memory = resources.setdefault("memory", {})
            if isinstance(memory, dict):
                memory["limit"] = memory_bytes
    return path


def edit_configs(
    bundle_dir: Path,
    containers: Sequence[str],
    actor_id: str,
    cpu_milli: int,
    memory_bytes: int,
    *,
    pod_network: bool,
) -> str:
    """Every edit the worker makes to the sandbox's configs, one read and at most one atomic
    write per container's config.json (in the directory it was read from): ``_pause`` sized
    (:func:`sized`; its cgroup returned); in a sandbox with app containers, each container
    given the CRI annotations that place it in the sandbox (what the create effect writes
    otherwise: it then finds them there and writes nothing; a config it cannot annotate is
    left to it, to fail as it does); with ``pod_network`` (``--sandbox-network pod``, with
    runsc ``--network=host``), no network namespace of its own, so the sandbox runs on the
    worker pod's. Blocks: run it in a thread."""
    cgroup = ""
    for container in (PAUSE, *containers):
        try:
            with _bundle.open_container(bundle_dir, container) as bundle:
                config, mode = bundle.read_config()
                changed = container == PAUSE
                if container == PAUSE:
                    cgroup = sized(config, cpu_milli, memory_bytes, f"{CGROUP_PARENT}/{actor_id}")
                if containers:
                    with contextlib.suppress(ValueError):
                        if (placed := sandbox.annotated(config, container)) is not None:
                            config, changed = placed, True
                if pod_network and _left_network(config):
                    changed = True
                if changed:
                    bundle.write_config(config, mode)
        except _bundle.BundleFileError as e:
            raise _bad_bundle(e) from e
    return cgroup


def _left_network(config: dict[str, object]) -> bool:
    """Drop ``linux.namespaces``' ``network`` entry from ``config`` (in place); whether
    there was one."""
    linux = config.get("linux")
    spaces = linux.get("namespaces") if isinstance(linux, dict) else None
    if not isinstance(spaces, list):
        return False
    kept = [n for n in spaces if not (isinstance(n, dict) and n.get("type") == "network")]
    if len(kept) == len(spaces):
        return False
    assert isinstance(linux, dict)
    linux["namespaces"] = kept
    return True


def read_pause_config(bundle_dir: Path) -> dict[str, object]:
    """``_pause``'s config.json in ``bundle_dir``. Blocks: run it in a thread."""
    return _read_config(bundle_dir, PAUSE)


def _read_config(bundle_dir: Path, container: str) -> dict[str, object]:
    try:
        config, _ = _bundle.read_config(bundle_dir, container)
    except _bundle.BundleFileError as e:
        raise _bad_bundle(e) from e
    return config


def _bad_bundle(error: _bundle.BundleFileError) -> BadRequest:
    hint = f"; every container, {PAUSE} included, needs its bundle there" if error.missing else ""
    return BadRequest(f"actor_dirs.oci_bundle_dir: {error}{hint}")
