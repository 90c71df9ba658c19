"""A stand-in for ``nvidia-ctk cdi generate`` (NVIDIA Container Toolkit 1.20 shape).

It implements the subset of the real CLI that substrate-gpu calls::

    nvidia-ctk cdi generate [--format=json|yaml] [--library-search-path=DIR]...
                            [--output=FILE] [--dev-root=DIR] [--nvidia-cdi-hook-path=P]

and discovers the node the way the real tool does, minus NVML: GPUs are the
``<dev-root>/dev/nvidia[0-9]*`` nodes, control nodes ``nvidiactl``/``nvidia-uvm``/
``nvidia-uvm-tools``; libraries are the ``*.so.*`` files of the library search path; the
driver version is the suffix of ``libcuda.so.<version>``; tools (nvidia-smi, …) are looked
up on ``PATH``. Output follows toolkit 1.20: devices ``<index>``, ``GPU-<uuid>`` and
``all``; device nodes carry major/minor/fileMode when they are real device nodes; the five
default createContainer hooks; compact JSON (``json.Marshal``) without a trailing newline,
or the ``---``-headed, 4-space-indented YAML.

Simulation knobs (environment): ``NVIDIA_CTK_STANDIN_SYSTEM_ROOT`` is the directory the
stand-in treats as the machine's ``/`` when discovering devices (a simulated node);
``NVIDIA_CTK_STANDIN_VERSION`` (default 1.20.0) below 1.19 omits device numbers, as older
toolkits did; from 1.20.1 each GPU device carries the ``createRuntime`` hook
``apply-cuda-memory-limits --driver-root R --gpu-id <uuid>`` (``all`` one per GPU), and from
1.20.2 the spec-level edits end with the void mount device (``/dev/null`` bound read-only at
``/var/run/nvidia-container-devices/void``), as those releases write them.

Failure modes reproduced: no ``libnvidia-ml.so.*`` found (the real tool fails to load
NVML), no ``nvidiactl``, and — for timeout tests — ``NVIDIA_CTK_STANDIN_HANG=1`` makes it
hang with a grandchild process, like a wrapper script would.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from substrate_gpu.cdi import bodies

TOOLS = (
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
    "nvidia-debugdump",
    "nvidia-persistenced",
    "nvidia-smi",
)
MOUNT_OPTIONS = ["ro", "nosuid", "nodev", "rbind", "rprivate"]
HOOK_ENV = ["NVIDIA_CTK_DEBUG=false"]
_GPU = re.compile(r"^nvidia([0-9]+)$")


def _fail(message: str) -> int:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ")
    print(f'time="{stamp}" level=error msg="{message}"', file=sys.stderr)
    return 1


def _version() -> tuple[int, ...]:
    raw = os.environ.get("NVIDIA_CTK_STANDIN_VERSION", "1.20.0")
    return tuple(int(p) for p in raw.split(".")[:3])


def _node(system_root: Path, dev_root: Path, name: str) -> bodies.DeviceNodeBody | None:
    host = system_root / dev_root.relative_to("/") / "dev" / name
    try:
        st = host.stat()
    except OSError:
        return None
    node: bodies.DeviceNodeBody = {"path": f"/dev/{name}"}
    if str(dev_root) != "/":
        node["hostPath"] = str(dev_root / "dev" / name)
    if stat.S_ISCHR(st.st_mode) and _version() >= (1, 19):
        node["major"] = os.major(st.st_rdev)
        if os.minor(st.st_rdev):
            node["minor"] = os.minor(st.st_rdev)
        node["fileMode"] = stat.S_IMODE(st.st_mode)
        node["permissions"] = "rwm"
    return node


def gpu_uuid(node_root: Path, index: int) -> str:
    """The UUID this stand-in gives GPU ``index`` of the node whose ``dev/`` is under
    ``node_root`` (stable per node, however the node's root is given: system root or
    ``--dev-root``; the simulated nvidia-smi lists the same)."""
    digest = hashlib.sha256(f"{node_root.resolve()}:{index}".encode()).hexdigest()
    return f"GPU-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"


def _hook(hook_path: str, *args: str, point: str = "createContainer") -> bodies.HookBody:
    return {
        "hookName": point,
        "path": hook_path,
        "args": ["nvidia-cdi-hook", *args],
        "env": HOOK_ENV,
    }


def _memory_limits_hook(hook_path: str, driver_root: str, uuid: str) -> bodies.HookBody:
    """Toolkit 1.20.1's per-GPU hook (``pkg/nvcdi/cuda-memory-limits.go``)."""
    args = ("apply-cuda-memory-limits", "--driver-root", driver_root, "--gpu-id", uuid)
    return _hook(hook_path, *args, point="createRuntime")


def build_spec(
    *,
    system_root: Path,
    dev_root: Path,
    library_dirs: list[Path],
    hook_path: str,
    path_env: str,
) -> bodies.SpecBody:
    """The spec the real 1.20.x toolkit would write for this node."""
    try:
        names = sorted(p.name for p in (system_root / dev_root.relative_to("/") / "dev").iterdir())
    except OSError:
        names = []
    gpus = sorted(int(m.group(1)) for n in names if (m := _GPU.match(n)))
    libraries = sorted(
        p for d in library_dirs if d.is_dir() for p in d.iterdir() if ".so." in p.name
    )
    if not any(p.name.startswith("libnvidia-ml.so.") for p in libraries):
        raise LookupError(
            "failed to generate CDI spec: failed to create device CDI specs: "
            "failed to initialize NVML: ERROR_LIBRARY_NOT_FOUND"
        )
    control = [
        n
        for c in ("nvidia-uvm", "nvidia-uvm-tools", "nvidiactl")
        if (n := _node(system_root, dev_root, c))
    ]
    if not any(n["path"] == "/dev/nvidiactl" for n in control):
        raise LookupError(
            "failed to generate CDI spec: failed to initialize NVML: ERROR_DRIVER_NOT_LOADED"
        )
    libcuda = next((p for p in libraries if p.name.startswith("libcuda.so.")), None)
    version = libcuda.name.removeprefix("libcuda.so.") if libcuda else "unknown"
    libdir = str(libcuda.parent) if libcuda else str(library_dirs[0])

    devices: list[bodies.DeviceBody] = []
    all_nodes: list[bodies.DeviceNodeBody] = []
    all_hooks: list[bodies.HookBody] = []
    memory_limits = _version() >= (1, 20, 1)
    for index in gpus:
        node = _node(system_root, dev_root, f"nvidia{index}")
        if node is None:
            continue
        all_nodes.append(node)
        uuid = gpu_uuid(system_root / dev_root.relative_to("/"), index)
        edits: bodies.ContainerEditsBody = {"deviceNodes": [node]}
        if memory_limits:
            edits["hooks"] = [_memory_limits_hook(hook_path, str(dev_root), uuid)]
            all_hooks.extend(edits["hooks"])
        devices.append({"name": str(index), "containerEdits": edits})
        devices.append({"name": uuid, "containerEdits": edits})
    all_edits: bodies.ContainerEditsBody = {"deviceNodes": all_nodes}
    if all_hooks:
        all_edits["hooks"] = all_hooks
    devices.append({"name": "all", "containerEdits": all_edits})

    mounts: list[bodies.MountBody] = []
    for tool in TOOLS:
        found = shutil.which(tool, path=path_env)
        if found:
            mounts.append(
                {"hostPath": found, "containerPath": f"/usr/bin/{tool}", "options": MOUNT_OPTIONS}
            )
    mounts.extend(
        {"hostPath": str(lib), "containerPath": str(lib), "options": MOUNT_OPTIONS}
        for lib in libraries
    )
    if _version() >= (1, 20, 2):
        mounts.append(
            {
                "hostPath": "/dev/null",
                "containerPath": "/var/run/nvidia-container-devices/void",
                "options": ["ro", "nosuid", "nodev", "bind"],
            }
        )
    hooks = [
        _hook(hook_path, "create-symlinks", "--link", f"libcuda.so.1::{libdir}/libcuda.so"),
        _hook(hook_path, "enable-cuda-compat", f"--host-driver-version={version}"),
        _hook(hook_path, "update-ldcache", "--folder", libdir),
        _hook(hook_path, "disable-device-node-modification"),
        _hook(hook_path, "update-application-profile"),
    ]
    return {
        "cdiVersion": "0.5.0",
        "kind": "nvidia.com/gpu",
        "devices": devices,
        "containerEdits": {
            "env": [f"NVIDIA_CTK_LIBCUDA_DIR={libdir}", "NVIDIA_VISIBLE_DEVICES=void"],
            "deviceNodes": control,
            "hooks": hooks,
            "mounts": mounts,
        },
    }


def _yaml(spec: bodies.SpecBody) -> str:
    import yaml  # noqa: PLC0415  (YAML output only)

    class _NoAliases(yaml.SafeDumper):
        def ignore_aliases(self, data: object) -> bool:
            return True

    body = yaml.dump(spec, Dumper=_NoAliases, sort_keys=False, indent=4, width=1 << 16)
    return "---\n" + body


def main(argv: list[str] | None = None) -> int:
    """Entry point; exit codes follow the real tool (0 ok, 1 failure)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if os.environ.get("NVIDIA_CTK_STANDIN_HANG") == "1":
        subprocess.Popen(["sleep", "3600"])  # a grandchild, as under a wrapper script
        time.sleep(3600)
    if args[:1] == ["--version"]:
        version = ".".join(map(str, _version()))
        print(f"NVIDIA Container Toolkit CLI version {version}\ncommit: standin")
        return 0
    if args[:2] != ["cdi", "generate"]:
        return _fail(f"unsupported command: {' '.join(args)} (stand-in implements 'cdi generate')")
    parser = argparse.ArgumentParser(prog="nvidia-ctk cdi generate", add_help=False)
    parser.add_argument("--format", default="yaml", choices=["json", "yaml"])
    parser.add_argument("--library-search-path", action="append", default=[])
    parser.add_argument("--output", default="")
    parser.add_argument("--dev-root", default="/")
    parser.add_argument("--driver-root", default="/")
    parser.add_argument("--nvidia-cdi-hook-path", default="/usr/bin/nvidia-cdi-hook")
    opts, unknown = parser.parse_known_args(args[2:])
    if unknown:
        return _fail(f"flag provided but not defined: {unknown[0]}")
    try:
        spec = build_spec(
            system_root=Path(os.environ.get("NVIDIA_CTK_STANDIN_SYSTEM_ROOT", "/")),
            dev_root=Path(opts.dev_root),
            library_dirs=[Path(p) for p in opts.library_search_path],
            hook_path=opts.nvidia_cdi_hook_path,
            path_env=os.environ.get("PATH", ""),
        )
    except LookupError as e:
        return _fail(str(e))
    text = json.dumps(spec, separators=(",", ":")) if opts.format == "json" else _yaml(spec)
    if opts.output:
        Path(opts.output).write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
