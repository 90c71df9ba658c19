"""Driver preflight: refuse, before any sandbox exists, what gVisor would fail after the fact.

Three questions, each a pure decision on plain facts, with thin readers beside them:

- **Does this runsc support the host's NVIDIA driver?** nvproxy speaks one ioctl ABI per
  driver version and lists them (``runsc nvproxy list-supported-drivers``). An unlisted
  driver makes ``runsc create --nvproxy`` fail deep in sandbox boot; we refuse first, with
  a message that says what to do. (A runsc without the list cannot be asked: the check is
  skipped and runsc's own ``unsupported Nvidia driver version`` remains, typed.) The list
  is the same on every architecture, but some versions exist for one only
  (:data:`DRIVER_ARCHITECTURE`: the pin's 615 and 620 branches are arm64 builds): on the
  other they are refused too.
- **Can this checkpoint be restored here?** nvproxy records the driver ABI in the image and
  a GPU sandbox expects its devices: a restore onto **another driver version** panics
  (``driver version … not found in abis map``), onto **fewer GPUs** fails when the saved
  device files are reopened. The :class:`CheckpointManifest` written next to the image
  records both; :func:`check_restore` compares them with the host.
- **Does this CPU have what the image's CPU had?** A gVisor snapshot is tied to the
  checkpointing host's CPU features (agent-substrate #1657): the sentry saved state (and
  the application's code paths) assuming them. Every checkpoint's manifest records the
  host's ``/proc/cpuinfo`` flags; :func:`check_cpu_features` refuses a restore onto a host
  lacking any of them, naming them, before runsc runs. The manifest also records the runsc
  version and the GPUs' models and UUIDs (``/proc/driver/nvidia/gpus/*/information``), so an
  image says where it came from.
- **Can cuda-checkpoint work?** It needs driver ≥ 550 (``--toggle``); the separate
  ``--action lock|checkpoint|restore|unlock`` and ``--timeout`` arrived with 570, and
  ``--action restore --device-map oldUuid=newUuid,…`` (CUDA state restored onto other
  GPUs) with 580.
- **Do the GPUs a restore is given fit the image?** Schema 4 records the actor's own GPUs
  (UUIDs, in allocation order) and each one's used device memory at checkpoint:
  :func:`gpu_pairs` pairs them with the restore's GPUs, :func:`check_remap` refuses a
  remapped restore the route cannot do, :func:`check_gpu_memory` one whose target GPUs
  have less free memory than the image's used (a cuda-checkpoint restore that runs out of
  device memory leaves the process unrecoverable).

Reading the driver version: the kernel module's ``/proc/driver/nvidia/version`` is what
nvproxy talks to, so it wins; the user-space ``<driver-root>/lib64/libcuda.so.<version>``
is the fallback where /proc/driver/nvidia is not visible. When both are readable and
disagree, the node is broken (user space and kernel module from different installs) and
GPU work is refused.
"""

from __future__ import annotations

import functools
import json
import platform
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal, Protocol, cast, runtime_checkable

from substrate_gpu import _atomic, _files, _process, exceptions
from substrate_gpu.injection import devices
from substrate_gpu.runsc import api as runsc_api

#: The kernel module's version file.
PROC_VERSION = Path("/proc/driver/nvidia/version")

#: Next to ``checkpoint.img`` in the image directory.
MANIFEST_NAME = "substrate-gpu-manifest.json"

#: The manifest format; bumped on incompatible changes. Schema 1 (driver, GPU count, CUDA
#: route only) is still read: its image's host CPU is unknown, so its restore is unchecked.
#: Schema 2 (no architecture, no runsc hash; CPU flags checked as a subset) is read too,
#: and checked as before. Schema 3 (no ``actor_gpus``) reads with the actor's GPUs unknown:
#: its restore is neither remapped nor checked for memory, as before.
MANIFEST_SCHEMA = 4
_READABLE_SCHEMAS = frozenset({1, 2, 3, MANIFEST_SCHEMA})

#: The CPU's feature flags (x86 ``flags``, arm64 ``Features``).
PROC_CPUINFO = Path("/proc/cpuinfo")
#: One directory per GPU, each with an ``information`` file (``Model:``, ``GPU UUID:``).
PROC_NVIDIA_GPUS = Path("/proc/driver/nvidia/gpus")

#: cuda-checkpoint's minimum driver (``--toggle``).
CUDA_CHECKPOINT_MIN_DRIVER = 550
#: The driver that added ``--action lock|checkpoint|restore|unlock`` and ``--timeout``.
CUDA_CHECKPOINT_ACTIONS_MIN_DRIVER = 570
#: The driver whose cuda-checkpoint takes ``--action restore --device-map`` (CUDA 13).
CUDA_CHECKPOINT_DEVICE_MAP_MIN_DRIVER = 580

#: The suspend routes that put CUDA state in an image (``events.ROUTE_*``: preflight sits
#: below the lifecycle, so the two names are spelt here too; a test holds them equal).
ROUTE_RUNSC = "runsc-cuda-checkpoint"
ROUTE_EXEC = "exec-cuda-checkpoint"

#: Why a preflight refused; bounded (a metric label).
RefusalCode = Literal[
    "driver-unreadable",
    "driver-mismatch",
    "driver-unsupported",
    "driver-too-old",
    "restore-other-driver",
    "restore-fewer-gpus",
    "restore-cpu-features",
    "restore-other-sandbox",
    "restore-gpu-remap",
    "restore-gpu-memory",
]

# "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.65.06  Sun Jul 27 …" (proprietary),
# "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.65.06  Release Build  …"
# (open), "… Open Kernel Module for aarch64 …"; old drivers have two-part versions (418.56).
_PROC_VERSION_LINE = re.compile(
    r"^NVRM version:.*?Kernel Module(?: for \S+)?\s+(\d+\.\d+(?:\.\d+)?)\s", re.MULTILINE
)
_LIBCUDA = re.compile(r"^libcuda\.so\.(\d+\.\d+(?:\.\d+)?)$")


class PreflightError(exceptions.SubstrateGpuError):
    """A preflight fact could not be read (a corrupt manifest, an unreadable version file)."""


@dataclass(frozen=True)
class Refusal:
    """A preflight said no: what, and why in words an operator can act on."""

    code: RefusalCode
    """The kind of refusal (bounded: a metric label, an event field)."""
    reason: str
    """The full explanation, naming the versions and counts involved."""


@dataclass(frozen=True)
class HostGpuFacts:
    """What the worker has: the driver version and the GPUs it holds."""

    driver_version: str
    """The NVIDIA driver version, e.g. ``580.65.06``."""
    gpu_count: int
    """How many ``/dev/nvidiaN`` nodes the worker holds (any indices)."""


@dataclass(frozen=True)
class GpuIdentity:
    """One GPU of the checkpointing host, as the driver names it."""

    model: str
    """``Tesla T4``."""
    uuid: str
    """``GPU-…``."""


@dataclass(frozen=True)
class CheckpointGpu:
    """One GPU the checkpointed actor held, and how much of its device memory was used."""

    uuid: str
    """``GPU-…``."""
    memory_used_mib: int | None = None
    """``nvidia-smi``'s ``memory.used`` (MiB) before the CUDA state left the GPU; None: not
    read (no nvidia-smi, or a GPU that does not report it)."""


@dataclass(frozen=True)
class GpuMemory:
    """One GPU's device memory now (``nvidia-smi --query-gpu=uuid,memory.used,memory.free``)."""

    uuid: str
    used_mib: int | None
    """None: the GPU reports ``[N/A]`` (or another non-number)."""
    free_mib: int | None


@dataclass(frozen=True)
class CheckpointManifest:
    """Where a checkpoint came from and what it needs from the node it is restored on;
    stored beside the image (every checkpoint, CPU and GPU)."""

    driver_version: str
    """The driver the sandbox ran on (nvproxy's ABI is tied to it); empty for a CPU actor
    on a node without a readable driver."""
    gpu_count: int
    """GPUs the sandbox held; a restore needs at least as many."""
    cuda_state_included: bool
    """The image holds CUDA state (suspended through cuda-checkpoint), not just a sandbox
    without contexts."""
    route: str = ""
    """How it was suspended (``runsc-cuda-checkpoint``, ``exec-cuda-checkpoint``, or empty)."""
    runsc_version: str = ""
    """``runsc --version``'s first line on the checkpointing host."""
    cpu_flags: tuple[str, ...] | None = None
    """The checkpointing host's CPU feature flags, sorted; None: unknown (schema 1)."""
    gpus: tuple[GpuIdentity, ...] = ()
    """The checkpointing host's GPUs (model and UUID), in device-minor order."""
    architecture: str = ""
    """The checkpointing host's architecture in Go's names (``amd64``, ``arm64``), as
    agent-substrate's ``architecture`` attribute; empty: unknown (schema < 3)."""
    runsc_sha256: str = ""
    """The SHA-256 of the runsc binary that wrote the image (agent-substrate's
    ``gvisor_asset_hash``); empty: unknown."""
    actor_gpus: tuple[CheckpointGpu, ...] = ()
    """The GPUs the actor itself held (not every GPU of the host), in allocation order,
    with their used memory; empty: unknown (schema < 4, or UUIDs that could not be
    resolved) or a CPU actor. A restore onto other GPUs is mapped pairwise in this order."""
    schema: int = MANIFEST_SCHEMA
    """The manifest format."""

    def to_json(self) -> bytes:
        """Stable, sorted JSON (one object)."""
        return (json.dumps(asdict(self), sort_keys=True, indent=2) + "\n").encode()

    @classmethod
    def from_json(cls, data: bytes | str, *, source: str = "<string>") -> CheckpointManifest:
        """Parse and check a manifest; :class:`PreflightError` names the bad field."""

        def bad(problem: str) -> PreflightError:
            return PreflightError(f"while reading checkpoint manifest {source}: {problem}")

        try:
            raw: object = json.loads(data)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise bad(f"invalid JSON ({e})") from e
        if not isinstance(raw, dict):
            raise bad("not a JSON object")
        payload = cast("dict[str, object]", raw)
        schema = payload.get("schema")
        if isinstance(schema, bool) or schema not in _READABLE_SCHEMAS:
            raise bad(f"unknown schema {schema!r} (this agent reads {sorted(_READABLE_SCHEMAS)})")
        version, count = payload.get("driver_version"), payload.get("gpu_count")
        cuda, route = payload.get("cuda_state_included"), payload.get("route", "")
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise bad(f"'gpu_count' must be a non-negative integer, not {count!r}")
        if not isinstance(cuda, bool):
            raise bad(f"'cuda_state_included' must be true or false, not {cuda!r}")
        # A CPU checkpoint may come from a node without a driver.
        if not isinstance(version, str) or (not version and (count or cuda or schema == 1)):
            raise bad("'driver_version' must be a non-empty string for a GPU checkpoint")
        if not isinstance(route, str):
            raise bad(f"'route' must be a string, not {route!r}")
        if schema == 1:
            return cls(
                driver_version=version,
                gpu_count=count,
                cuda_state_included=cuda,
                route=route,
                schema=1,
            )
        runsc_version = payload.get("runsc_version")
        if not isinstance(runsc_version, str):
            raise bad(f"'runsc_version' must be a string, not {runsc_version!r}")
        origin: dict[str, str] = {}
        for name in ("architecture", "runsc_sha256") if schema >= 3 else ():
            value = payload.get(name)
            if not isinstance(value, str):
                raise bad(f"'{name}' must be a string, not {value!r}")
            origin[name] = value
        return cls(
            driver_version=version,
            gpu_count=count,
            cuda_state_included=cuda,
            route=route,
            runsc_version=runsc_version,
            cpu_flags=(
                None if (flags := payload.get("cpu_flags")) is None else _cpu_flags(flags, bad)
            ),
            gpus=_gpu_list(payload.get("gpus"), bad),
            actor_gpus=_actor_gpus(payload.get("actor_gpus"), bad) if schema >= 4 else (),
            schema=schema,
            **origin,
        )


def _actor_gpus(raw: object, bad: Callable[[str], PreflightError]) -> tuple[CheckpointGpu, ...]:
    if not isinstance(raw, list):
        raise bad("'actor_gpus' must be a list of {uuid, memory_used_mib} objects")
    found = []
    for i, item in enumerate(cast("list[object]", raw)):
        fields = cast("dict[str, object]", item) if isinstance(item, dict) else {}
        uuid, used = fields.get("uuid"), fields.get("memory_used_mib")
        if not isinstance(uuid, str) or not uuid:
            raise bad(f"'actor_gpus[{i}].uuid' must be a non-empty string, not {uuid!r}")
        if used is not None and (isinstance(used, bool) or not isinstance(used, int) or used < 0):
            raise bad(
                f"'actor_gpus[{i}].memory_used_mib' must be null or a non-negative integer, "
                f"not {used!r}"
            )
        found.append(CheckpointGpu(uuid=uuid, memory_used_mib=used))
    return tuple(found)


def _cpu_flags(raw: object, bad: Callable[[str], PreflightError]) -> tuple[str, ...]:
    items = cast("list[object]", raw) if isinstance(raw, list) else None
    if items is None or not all(isinstance(x, str) and x for x in items):
        raise bad("'cpu_flags' must be null or a list of non-empty strings")
    return tuple(cast("list[str]", items))


def _gpu_list(raw: object, bad: Callable[[str], PreflightError]) -> tuple[GpuIdentity, ...]:
    if not isinstance(raw, list):
        raise bad("'gpus' must be a list of {model, uuid} objects")
    gpus = []
    for i, item in enumerate(cast("list[object]", raw)):
        fields = cast("dict[str, object]", item) if isinstance(item, dict) else {}
        model, uuid = fields.get("model"), fields.get("uuid")
        if not isinstance(model, str) or not isinstance(uuid, str):
            raise bad(f"'gpus[{i}]' must be an object with string 'model' and 'uuid'")
        gpus.append(GpuIdentity(model=model, uuid=uuid))
    return tuple(gpus)


# -- pure decisions -------------------------------------------------------------------------


def parse_proc_version(text: str) -> str | None:
    """The driver version in ``/proc/driver/nvidia/version`` text, or None if absent."""
    match = _PROC_VERSION_LINE.search(text)
    return match.group(1) if match else None


def version_from_libcuda_names(names: list[str]) -> str | None:
    """The version of ``libcuda.so.<version>`` among file names (``libcuda.so.1`` is a SONAME
    link, not a version). :class:`PreflightError` when two versions are installed."""
    found = sorted({m.group(1) for n in names if (m := _LIBCUDA.match(n)) and "." in m.group(1)})
    if len(found) > 1:
        raise PreflightError(
            f"while reading the NVIDIA driver version: several libcuda versions installed "
            f"({', '.join(found)}); remove the stale one"
        )
    return found[0] if found else None


def major_of(version: str) -> int:
    """``580`` for ``580.65.06``."""
    return int(version.split(".", 1)[0])


def decide_driver_version(proc_version: str | None, libcuda_version: str | None) -> str | Refusal:
    """The host's driver version from the two sources (the kernel module's wins)."""
    if proc_version and libcuda_version and proc_version != libcuda_version:
        return Refusal(
            "driver-mismatch",
            f"the NVIDIA kernel module is {proc_version} but the driver root holds libcuda "
            f"{libcuda_version}: user space and kernel module must come from one install; "
            "fix the node's driver installation",
        )
    version = proc_version or libcuda_version
    if version is None:
        return Refusal(
            "driver-unreadable",
            "no NVIDIA driver version found (neither /proc/driver/nvidia/version nor "
            "<driver-root>/lib64/libcuda.so.<version>); is the driver installed and the "
            "driver root (ATE_NVIDIA_DRIVER_ROOT) right?",
        )
    return version


#: The drivers the pinned gVisor's nvproxy supports on one architecture only (Go's names).
#: Its ABI table (``pkg/sentry/devices/nvproxy/version.go``, ``addDriverABI``) records, per
#: version, the SHA-256 of NVIDIA's ``.run`` installer for x86_64 and for arm64, and
#: ``ChecksumNoDriver`` where NVIDIA published none ("mostly for ARM drivers that NVIDIA
#: does not provide a driver installer"): such a version was qualified on the other
#: architecture only, although ``runsc nvproxy list-supported-drivers`` lists it on both.
#: The 615 and 620 branches of the pin are arm64-only builds (Grace); a few 535-580
#: releases are x86_64-only. ``tests/runsc/test_real_drivers.py`` checks this table against
#: the pinned source.
DRIVER_ARCHITECTURE: dict[str, str] = {
    "535.183.06": "amd64",
    "550.90.12": "amd64",
    "570.124.06": "amd64",
    "570.133.20": "amd64",
    "580.105.08": "amd64",
    "580.126.20": "amd64",
    "615.15.00": "arm64",
    "615.62.00": "arm64",
    "620.06.00": "arm64",
}


def _usable_on(version: str, architecture: str) -> bool:
    return DRIVER_ARCHITECTURE.get(version, architecture) == architecture


def check_driver_supported(
    version: str, supported: tuple[str, ...] | None, *, architecture: str
) -> Refusal | None:
    """Refuse a driver runsc's nvproxy does not list (``None``: runsc cannot list; no check),
    or lists for another ``architecture`` only (:data:`DRIVER_ARCHITECTURE`)."""
    if supported is None:
        return None
    here = tuple(v for v in supported if _usable_on(v, architecture))
    same_branch = [v for v in here if major_of(v) == major_of(version)]
    hint = (
        f"supported {major_of(version)}.x drivers on {architecture}: {', '.join(same_branch)}"
        if same_branch
        else f"runsc supports {len(here)} drivers on {architecture}, none of the"
        f" {major_of(version)} branch"
    )
    if version in supported and version not in here:
        return Refusal(
            "driver-unsupported",
            f"NVIDIA driver {version} is listed by this runsc's nvproxy only as an"
            f" {DRIVER_ARCHITECTURE[version]} build: gVisor's ABI table has no {architecture}"
            f" installer of it (ChecksumNoDriver), so it was qualified on"
            f" {DRIVER_ARCHITECTURE[version]} only, and this node is {architecture} ({hint});"
            " install a driver supported on this architecture — refused before creating any"
            " sandbox",
        )
    if version in supported:
        return None
    return Refusal(
        "driver-unsupported",
        f"NVIDIA driver {version} is not supported by this runsc's nvproxy ({hint}); "
        "install a listed driver or a runsc that supports this one — refused before "
        "creating any sandbox",
    )


def check_cuda_checkpoint_driver(version: str, *, need_actions: bool = False) -> Refusal | None:
    """Refuse a driver too old for cuda-checkpoint (550; 570 for ``--action``/``--timeout``)."""
    minimum = CUDA_CHECKPOINT_ACTIONS_MIN_DRIVER if need_actions else CUDA_CHECKPOINT_MIN_DRIVER
    if major_of(version) >= minimum:
        return None
    what = "lock/checkpoint/restore/unlock actions with a lock timeout" if need_actions else "it"
    return Refusal(
        "driver-too-old",
        f"cuda-checkpoint needs NVIDIA driver {minimum} or newer for {what}; "
        f"this node runs {version}",
    )


def parse_cpu_flags(cpuinfo: str) -> tuple[str, ...]:
    """The CPU feature flags in ``/proc/cpuinfo`` text, sorted (x86 ``flags``, arm64
    ``Features``; the first processor's line: the kernel reports the common set)."""
    match = re.search(r"^(?:flags|Features)\s*:(.*)$", cpuinfo, re.MULTILINE)
    return tuple(sorted(set(match.group(1).split()))) if match else ()


def parse_gpu_information(text: str) -> tuple[int, GpuIdentity] | None:
    """``(device minor, identity)`` from one ``/proc/driver/nvidia/gpus/<bus>/information``
    file, or None when it names no model or UUID."""
    fields = {
        key.strip(): value.strip()
        for key, sep, value in (line.partition(":") for line in text.splitlines())
        if sep
    }
    model, uuid = fields.get("Model", ""), fields.get("GPU UUID", "")
    if not model or not uuid:
        return None
    minor = fields.get("Device Minor", "")
    return (int(minor) if minor.isdigit() else 0), GpuIdentity(model=model, uuid=uuid)


def check_cpu_features(manifest: CheckpointManifest, host_flags: tuple[str, ...]) -> Refusal | None:
    """Refuse restoring an image whose host CPU had features this one lacks (None: fine, or
    the image's CPU is unknown)."""
    if manifest.cpu_flags is None:
        return None
    missing = sorted(set(manifest.cpu_flags) - set(host_flags))
    if not missing:
        return None
    return Refusal(
        "restore-cpu-features",
        f"the checkpoint was taken on a CPU with feature(s) this node's CPU lacks: "
        f"{', '.join(missing)}; a gVisor snapshot is tied to its host's CPU features: restore "
        "on a node whose CPU has them (same CPU model or newer) — refused before runsc ran",
    )


#: ``platform.machine()`` names → Go's ``runtime.GOARCH`` (agent-substrate's values).
_GOARCH = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}


def host_architecture() -> str:
    """This host's architecture as Go names it (``amd64``, ``arm64``; others as the kernel
    does)."""
    machine = platform.machine()
    return _GOARCH.get(machine.lower(), machine.lower())


def check_sandbox_compat(
    manifest: CheckpointManifest,
    *,
    architecture: str,
    cpu_flags: tuple[str, ...],
    runsc_sha256: str,
) -> Refusal | None:
    """Refuse a restore as agent-substrate's ``MatchesCompat`` would: every attribute the
    image records must equal this host's, exactly (one an older image lacks is no
    constraint). Schema 3 compares the CPU feature set exactly too; schema 2 images keep
    the subset check of :func:`check_cpu_features` (gVisor's own rule)."""
    if manifest.schema < 3:
        return check_cpu_features(manifest, cpu_flags)
    host = {"architecture": architecture, "runsc_sha256": runsc_sha256}
    differ = [
        f"{name} {getattr(manifest, name)} (this node: {host[name] or 'unknown'})"
        for name in ("architecture", "runsc_sha256")
        if getattr(manifest, name) and getattr(manifest, name) != host[name]
    ]
    if manifest.cpu_flags is not None and set(manifest.cpu_flags) != set(cpu_flags):
        missing = sorted(set(manifest.cpu_flags) - set(cpu_flags))
        extra = sorted(set(cpu_flags) - set(manifest.cpu_flags))
        differ.append(
            "cpu_features differ (this node lacks: "
            f"{', '.join(missing) or 'none'}; has beyond the image: {', '.join(extra) or 'none'})"
        )
    if not differ:
        return None
    return Refusal(
        "restore-other-sandbox",
        f"the checkpoint was written by another sandbox runtime: {'; '.join(differ)}; a "
        "snapshot restores only where architecture, CPU features and the runsc build match "
        "exactly (level CPU features across a pool with the dev.gvisor.internal.cpufeatures "
        "annotation) — refused before runsc ran",
    )


def check_restore(manifest: CheckpointManifest, host: HostGpuFacts) -> Refusal | None:
    """Refuse restoring ``manifest``'s checkpoint on ``host``: another driver, fewer GPUs."""
    if manifest.gpu_count == 0 and not manifest.cuda_state_included:
        return None  # a CPU sandbox: nothing GPU-bound in the image
    if manifest.driver_version != host.driver_version:
        return Refusal(
            "restore-other-driver",
            f"the checkpoint was taken on NVIDIA driver {manifest.driver_version}, this node "
            f"runs {host.driver_version}: nvproxy cannot restore across driver versions; "
            "restore on a node with the same driver",
        )
    if host.gpu_count < manifest.gpu_count:
        return Refusal(
            "restore-fewer-gpus",
            f"the checkpoint holds {manifest.gpu_count} GPU(s), this worker has "
            f"{host.gpu_count}: restore on a worker with at least as many GPUs",
        )
    return None


def gpu_pairs(
    manifest: CheckpointManifest, restore_uuids: tuple[str, ...]
) -> tuple[tuple[str, str], ...]:
    """``(checkpointed UUID, restore UUID)`` per GPU the image's actor held, paired in order
    (both in allocation order, lowest index first: gVisor pairs nvproxy's devices by minor
    the same way, so CUDA's device 0 stays device 0). Empty when the image does not name its
    GPUs or the restore's are unknown: nothing can be paired."""
    if not manifest.actor_gpus or len(restore_uuids) < len(manifest.actor_gpus):
        return ()
    return tuple((g.uuid, new) for g, new in zip(manifest.actor_gpus, restore_uuids, strict=False))


def device_map(pairs: tuple[tuple[str, str], ...]) -> str:
    """cuda-checkpoint's ``--device-map`` value (``old=new,old=new``), or empty when every
    GPU is restored onto itself. It names every checkpointed GPU, as the tool requires."""
    if all(old == new for old, new in pairs):
        return ""
    return ",".join(f"{old}={new}" for old, new in pairs)


def check_remap(
    device_map_: str,
    *,
    route: str,
    driver_version: str,
    runsc_creates_device_files: bool | None,
) -> Refusal | None:
    """Refuse restoring CUDA state onto other GPUs where the route cannot (None: no remap
    needed, or it can be done).

    - The exec route passes ``--action restore --device-map`` itself: driver ≥ 580, and a
      runsc with google/gvisor#14525 (``runsc_creates_device_files``, detected in the
      binary: :attr:`~substrate_gpu.runsc.api.RunscFeatures.restore_creates_gpu_device_files`).
      cuda-checkpoint closed every GPU file before ``runsc checkpoint``, so the image holds
      no device remap metadata, and a runsc without the fix creates no ``/dev/nvidiaN`` for
      the restore's other GPUs: the CUDA state would come back with no device to reach.
    - runsc's route restores CUDA processes inside ``runsc restore`` with ``--toggle`` and
      no device map at the pinned gVisor (``pkg/sentry/control/state_cuda.go``: "FIXME:
      b/460451448 - pass --device-map to cuda-checkpoint if accepted"), and ``runsc
      restore`` has no flag to give one: the CUDA state would come back on GPUs the
      sandbox no longer holds.
    - An image without CUDA state (``route`` empty) needs no map: nvproxy reopens the new
      GPUs' device files itself.
    """
    if not device_map_ or not route:
        return None
    if route == ROUTE_RUNSC:
        return Refusal(
            "restore-gpu-remap",
            f"the checkpoint's CUDA state was saved by runsc (--cuda-checkpoint-path) on other "
            f"GPUs than this restore holds ({device_map_}); this runsc restores CUDA state "
            "without a device map (no runsc restore flag gives one): restore onto the same "
            "GPUs, or checkpoint through the sandbox (exec route) — refused before runsc ran",
        )
    if major_of(driver_version) < CUDA_CHECKPOINT_DEVICE_MAP_MIN_DRIVER:
        return Refusal(
            "restore-gpu-remap",
            f"restoring CUDA state onto other GPUs ({device_map_}) needs cuda-checkpoint "
            f"--device-map, NVIDIA driver {CUDA_CHECKPOINT_DEVICE_MAP_MIN_DRIVER} or newer; "
            f"this node runs {driver_version}: restore onto the same GPUs, or on a node with a "
            "newer driver — refused before runsc ran",
        )
    if not runsc_creates_device_files:
        found = (
            "carries only the remap-metadata-gated createRemappedNvproxyDeviceFiles"
            if runsc_creates_device_files is False
            else "shows neither createNvproxyDeviceFilesAfterRestore nor"
            " createRemappedNvproxyDeviceFiles, so whether it has the fix cannot be told"
        )
        return Refusal(
            "restore-gpu-remap",
            f"restoring CUDA state onto other GPUs ({device_map_}) from an image saved after "
            "cuda-checkpoint (no GPU file open, so no device remap metadata) needs a runsc "
            "that creates /dev/nvidiaN for the restore's GPUs regardless of that metadata "
            f"(google/gvisor#14525); this runsc {found}: without it the restored sandbox has "
            "no device files for the new GPUs. Restore onto the same GPUs, or upgrade runsc "
            "— refused before runsc ran",
        )
    return None


def check_gpu_memory(
    manifest: CheckpointManifest,
    pairs: tuple[tuple[str, str], ...],
    memory: tuple[GpuMemory, ...],
) -> Refusal | None:
    """Refuse a restore whose target GPUs have less free device memory than the image's
    GPUs used (None: enough, or nothing recorded to compare)."""
    used = {g.uuid: g.memory_used_mib for g in manifest.actor_gpus}
    free = {m.uuid: m.free_mib for m in memory}
    short: list[str] = []
    for old, new in pairs:
        need = used.get(old)
        if need is None:
            continue
        have = free.get(new)
        if have is None:
            short.append(f"{new} (needs {need} MiB; its free memory could not be read)")
        elif have < need:
            short.append(f"{new} (needs {need} MiB, {have} MiB free)")
    if not short:
        return None
    return Refusal(
        "restore-gpu-memory",
        f"too little free GPU memory for the checkpoint's CUDA state: {'; '.join(short)}; a "
        "cuda-checkpoint restore that runs out of device memory leaves the process "
        "unrecoverable: free the GPU(s) or restore elsewhere — refused before runsc ran",
    )


def _mib(field: str) -> int | None:
    return int(field) if field.isdigit() else None


def parse_gpu_memory(csv: str) -> tuple[GpuMemory, ...]:
    """``nvidia-smi --query-gpu=uuid,memory.used,memory.free --format=csv,noheader,nounits``
    output, one GPU a line (``GPU-…, 1234, 79000``); :class:`PreflightError` on a line
    that is not three fields."""
    found = []
    for number, line in enumerate(csv.splitlines(), 1):
        if not line.strip():
            continue
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != 3 or not fields[0]:
            raise PreflightError(
                f"while reading GPU memory from nvidia-smi: line {number} is not "
                f"'uuid, used, free': {line.strip()[:200]!r}"
            )
        found.append(GpuMemory(uuid=fields[0], used_mib=_mib(fields[1]), free_mib=_mib(fields[2])))
    return tuple(found)


_LISTED_UUID = re.compile(r"\(UUID: ([^)\s]+)\)")


def parse_gpu_list(listing: str) -> tuple[str, ...]:
    """The UUIDs ``nvidia-smi -L`` lists (``GPU 0: NVIDIA H200 (UUID: GPU-…)``; MIG devices'
    ``MIG-…`` too), in listed order."""
    return tuple(_LISTED_UUID.findall(listing))


#: The query :func:`read_gpu_memory` runs.
GPU_MEMORY_QUERY = (
    "--query-gpu=uuid,memory.used,memory.free",
    "--format=csv,noheader,nounits",
)


async def read_gpu_memory(nvidia_smi: str, *, timeout: float = 30.0) -> tuple[GpuMemory, ...]:
    """Every GPU's used and free device memory, from the host's nvidia-smi
    (:class:`PreflightError` when it cannot be run or answers otherwise)."""
    try:
        result = await _process.run_command(
            (nvidia_smi, *GPU_MEMORY_QUERY), timeout=timeout, what="reading GPU memory"
        )
    except exceptions.ExternalCommandError as e:
        raise PreflightError(str(e)) from e
    return parse_gpu_memory(result.stdout)


# -- thin readers ---------------------------------------------------------------------------


def read_proc_version(path: Path = PROC_VERSION) -> str | None:
    """The version in the kernel module's file, or None where it is absent."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return None
    except OSError as e:
        raise PreflightError(f"while reading the NVIDIA driver version from {path}: {e}") from e
    return parse_proc_version(text)


def read_libcuda_version(driver_root: Path) -> str | None:
    """The version suffix of ``<driver_root>/lib64/libcuda.so.<version>``, or None."""
    try:
        names = [p.name for p in (driver_root / "lib64").iterdir()]
    except OSError:
        return None
    return version_from_libcuda_names(names)


def host_facts(
    *, driver_root: Path, proc_version: Path = PROC_VERSION, dev_root: Path = Path("/")
) -> HostGpuFacts | Refusal:
    """Read the driver version (kernel module first, driver root second) and count GPUs."""
    decided = decide_driver_version(
        read_proc_version(proc_version), read_libcuda_version(driver_root)
    )
    if isinstance(decided, Refusal):
        return decided
    return HostGpuFacts(driver_version=decided, gpu_count=len(devices.detect_gpus(dev_root)))


@functools.cache
def read_cpu_flags(path: Path = PROC_CPUINFO) -> tuple[str, ...]:
    """This host's CPU feature flags (:class:`PreflightError` when cpuinfo is unreadable).

    Read once per process: a host's CPU features do not change while the agent runs, and
    every checkpoint (manifest) and restore (check) needs them. A failure is not cached.
    """
    try:
        return parse_cpu_flags(path.read_text(encoding="utf-8", errors="replace"))
    except OSError as e:
        raise PreflightError(f"while reading the CPU feature flags from {path}: {e}") from e


def read_gpu_identities(root: Path = PROC_NVIDIA_GPUS) -> tuple[GpuIdentity, ...]:
    """This host's GPUs as the driver lists them (empty without a driver)."""
    try:
        directories = sorted(root.iterdir())
    except OSError:
        return ()
    found: list[tuple[int, GpuIdentity]] = []
    for directory in directories:
        try:
            text = (directory / "information").read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        parsed = parse_gpu_information(text)
        if parsed is not None:
            found.append(parsed)
    return tuple(identity for _, identity in sorted(found, key=lambda item: item[0]))


def write_manifest(image_path: Path, manifest: CheckpointManifest) -> Path:
    """Write the manifest atomically into the checkpoint's image directory; return its path."""
    path = image_path / MANIFEST_NAME
    try:
        _atomic.write_atomically(path, manifest.to_json(), default_mode=0o600)
    except OSError as e:
        raise PreflightError(f"while writing checkpoint manifest {path}: {e}") from e
    return path


#: The largest manifest read (a real one is under 1 KiB).
MAX_MANIFEST_BYTES = 1 << 20


def read_manifest(image_path: Path) -> CheckpointManifest | None:
    """The manifest beside a checkpoint image, or None when it has none (a CPU checkpoint,
    or one from before manifests)."""
    path = image_path / MANIFEST_NAME
    try:
        # The image directory is shipped by another component: a FIFO here would block
        # the effect (and the event loop) for ever, a symlink read a host file.
        data, _ = _files.read_regular_file(
            str(path), max_bytes=MAX_MANIFEST_BYTES, what="a checkpoint manifest"
        )
    except FileNotFoundError:
        return None
    except (OSError, _files.NotReadable) as e:
        raise PreflightError(f"while reading checkpoint manifest {path}: {e}") from e
    return CheckpointManifest.from_json(data, source=str(path))


@runtime_checkable
class DriverLister(Protocol):
    """The part of the runtime preflight asks (:class:`~substrate_gpu.runsc.RunscDriver`)."""

    async def features(self) -> runsc_api.RunscFeatures:
        """What the runtime supports."""
        ...

    async def list_supported_drivers(self) -> tuple[str, ...]:
        """``runsc nvproxy list-supported-drivers``."""
        ...


async def supported_drivers(runtime: DriverLister) -> tuple[str, ...] | None:
    """The drivers runsc's nvproxy supports, or None for a runsc that cannot list them."""
    if not (await runtime.features()).list_supported_drivers:
        return None
    return await runtime.list_supported_drivers()


async def preflight_host(
    runtime: DriverLister,
    *,
    driver_root: Path,
    proc_version: Path = PROC_VERSION,
    dev_root: Path = Path("/"),
    architecture: str | None = None,
) -> HostGpuFacts | Refusal:
    """Before ``create``/``restore`` of a GPU sandbox: the host's facts, or why to refuse.
    ``architecture``: Go's name for this host's (default: :func:`host_architecture`)."""
    facts = host_facts(driver_root=driver_root, proc_version=proc_version, dev_root=dev_root)
    if isinstance(facts, Refusal):
        return facts
    refusal = check_driver_supported(
        facts.driver_version,
        await supported_drivers(runtime),
        architecture=architecture or host_architecture(),
    )
    return refusal or facts
