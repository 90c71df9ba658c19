"""A stand-in for gVisor's ``runsc`` over real runc, for the demo and tests without gVisor or a GPU.

A standalone script (standard library only), run by its path: ``python
.../substrate_gpu/testing/runsc.py`` (the simulated node installs a ``runsc`` wrapper that
does so, next to ``nvidia-ctk``; ``tests/standins/runsc`` runs it the same way). It lives in
the package so the demo, from an installed package without the tests/ tree, finds it; it
imports nothing of the package, so a runsc command never pays for loading it.

Same command-line shape as runsc (Go ``flag`` parsing: global flags before the subcommand,
``--flag=value`` or ``--flag value``, ``-flag`` or ``--flag``, unknown flags rejected with
exit 2), and gVisor's documented checkpoint failure modes. Container operations are
delegated to real ``runc --root <same root>``. See tests/standins/README.md for fidelity,
limits and the environment knobs. Standard library only.

The environment knobs are read when the module is imported: it is a program, run once per
invocation, not a library.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ENV = os.environ
DEFAULT_FEATURES = (
    "leave-running,cuda-checkpoint-path,nvproxy-list,nvproxy-driver-version,"
    "cpu-num-from-quota,allow-connected-on-save,restore-background"
)
FEATURES = {f.strip() for f in ENV.get("RUNSC_STANDIN_FEATURES", DEFAULT_FEATURES).split(",")}
VERSION = ENV.get("RUNSC_STANDIN_VERSION", "release-20250512.0")
DRIVERS = [
    d.strip()
    for d in ENV.get("RUNSC_STANDIN_DRIVERS", "535.183.01,550.90.07,570.133.20,580.65.06").split(
        ","
    )
    if d.strip()
]
DEVICE_PATTERN = re.compile(
    ENV.get("RUNSC_STANDIN_DEVICE_PATTERN", r"/dev/nvidia(?:ctl|-uvm|-uvm-tools|[0-9]+)")
)
RUNC = ENV.get("RUNSC_STANDIN_RUNC", "runc")
CHECKPOINT_FILE = "checkpoint.img"

# Global flags: name -> takes a value. Booleans never consume the next argument (Go flag).
GLOBAL_FLAGS = {
    "root": True,
    "debug-log": True,
    "log": True,
    "log-format": True,
    "platform": True,
    "network": True,
    "nvproxy": False,
    "nvproxy-docker": False,
    "debug": False,
    "rootless": False,
    "version": False,
    "nvproxy-allowed-driver-capabilities": True,
}
if "nvproxy-driver-version" in FEATURES:
    GLOBAL_FLAGS["nvproxy-driver-version"] = True
# Global booleans of today's runsc that older builds lack (upstream's worker passes them).
for _flag in ("cpu-num-from-quota", "allow-connected-on-save"):
    if _flag in FEATURES:
        GLOBAL_FLAGS[_flag] = False

COMMAND_FLAGS: dict[str, dict[str, bool]] = {
    "create": {"bundle": True, "pid-file": True, "console-socket": True, "user-log": True},
    "start": {},
    "state": {},
    "kill": {"all": False, "pid": True},
    "delete": {"force": False},
    "pause": {},
    "resume": {},
    "ps": {"format": True},
    "checkpoint": {
        "image-path": True,
        "work-path": True,
        "compression": True,
        "direct": False,
    },
    "restore": {
        "bundle": True,
        "image-path": True,
        "pid-file": True,
        "console-socket": True,
        "work-path": True,
        "detach": False,
        "direct": False,
    },
    "exec": {
        "detach": False,
        "cwd": True,
        "env": True,
        "user": True,
        "pid-file": True,
        "internal-pid-file": True,
        "console-socket": True,
    },
    "help": {},
    "flags": {},
    "nvproxy": {},
}
if "leave-running" in FEATURES:
    COMMAND_FLAGS["checkpoint"]["leave-running"] = False
if "cuda-checkpoint-path" in FEATURES:
    COMMAND_FLAGS["checkpoint"]["cuda-checkpoint-path"] = True
if "cuda-checkpoint-sequential" in FEATURES:
    COMMAND_FLAGS["checkpoint"]["cuda-checkpoint-sequential"] = False
if "restore-background" in FEATURES:
    # Image loading that goes on after restore exits: nothing to load lazily here.
    COMMAND_FLAGS["restore"]["background"] = False

USAGES = {
    "create": "create [flags] <container id> - create a secure container",
    "start": "start <container id> - start a secure container.",
    "state": "state [flags] <container id> - get the container state",
    "kill": "kill [flags] <container id> <signal>",
    "delete": "delete [flags] <container ids>",
    "pause": "pause <container id> - pause all processes in the container",
    "resume": "resume <container id> - resume a paused container",
    "ps": "ps [flags] <container id> [ps options]",
    "checkpoint": "checkpoint [flags] <container id> - save current state of container.",
    "restore": "restore [flags] <id> - restore a secure container from an image.",
    "exec": "exec [command options] <container-id> <command> [command options]",
}
FLAG_HELP = {
    "bundle": "path to the root of the bundle directory, defaults to the current directory",
    "pid-file": "filename that the container pid will be written to",
    "image-path": "directory path to saved container image",
    "leave-running": "restart the container after checkpointing",
    "cuda-checkpoint-path": "path to cuda-checkpoint binary; if set, CUDA state is saved",
    "cuda-checkpoint-sequential": "run cuda-checkpoint sequentially instead of in parallel",
    "detach": "detach from the container's process",
    "force": "destroy container forcefully, if running",
    "format": "output format: table or json",
}


class Fatal(Exception):
    """util.Fatalf: message on stderr, exit 128."""


class Usage(Exception):
    """A usage error: exit 2."""


def log_argv(argv: list[str]) -> None:
    path = ENV.get("RUNSC_STANDIN_ARGV_LOG")
    if path:
        with Path(path).open("a", encoding="utf-8") as f:
            f.write(json.dumps(argv) + "\n")


def parse_flags(args: list[str], known: dict[str, bool]) -> tuple[dict[str, str], list[str]]:
    """Go flag parsing: flags until the first non-flag argument or ``--``."""
    values: dict[str, str] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            return values, args[i + 1 :]
        if not arg.startswith("-") or arg == "-":
            break
        name = arg.lstrip("-")
        value: str | None = None
        if "=" in name:
            name, value = name.split("=", 1)
        if name not in known:
            raise Usage(f"flag provided but not defined: -{name}")
        if known[name] and value is None:
            if i + 1 >= len(args):
                raise Usage(f"flag needs an argument: -{name}")
            i += 1
            value = args[i]
        values[name] = value if value is not None else "true"
        i += 1
    return values, args[i:]


def runc(root: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    # stdin/stdout/stderr of `runc create` become the container's: hand it ours, so the
    # container outlives us exactly as a runsc sandbox outlives `runsc create`.
    if args and args[0] == "create":
        proc = subprocess.run([RUNC, "--root", root, *args], check=False, text=True)
        out = subprocess.CompletedProcess(proc.args, proc.returncode, "", "")
    else:
        out = subprocess.run(
            [RUNC, "--root", root, *args], check=False, text=True, capture_output=True
        )
    if check and out.returncode != 0:
        raise Fatal(runc_message(out.stderr) or f"runc {args[0]} failed ({out.returncode})")
    return out


def runc_message(stderr: str) -> str:
    msgs = re.findall(r'msg="((?:[^"\\]|\\.)*)"', stderr)
    return "; ".join(msgs) if msgs else stderr.strip()


def load_state(root: str, cid: str) -> dict[str, object]:
    out = runc(root, "state", cid, check=False)
    if out.returncode != 0:
        if "does not exist" in out.stderr:
            raise Fatal("FetchSpec failed: loading container: file does not exist")
        raise Fatal(f"FetchSpec failed: loading container: {runc_message(out.stderr)}")
    state = json.loads(out.stdout)
    assert isinstance(state, dict)
    return state


def wait_status(root: str, cid: str, wanted: str, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if load_state(root, cid).get("status") == wanted:
            return
        time.sleep(0.02)
    raise Fatal(f"container {cid!r} did not reach state {wanted} within {timeout}s")


def container_pids(root: str, cid: str) -> list[int]:
    out = runc(root, "ps", "--format", "json", cid)
    pids = json.loads(out.stdout or "[]")
    return [int(p) for p in pids]


def live_device_fds(pids: list[int]) -> list[str]:
    found = []
    for pid in pids:
        fd_dir = Path(f"/proc/{pid}/fd")
        try:
            fds = list(fd_dir.iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                target = str(fd.readlink())
            except OSError:
                continue
            target = target.removesuffix(" (deleted)")
            if DEVICE_PATTERN.fullmatch(target):
                found.append(f"{pid}:{fd.name}->{target}")
    return found


def maybe_hang(command: str) -> None:
    for entry in ENV.get("RUNSC_STANDIN_DELAY", "").split(","):
        delayed, _, seconds = entry.strip().partition("=")
        if delayed == command and seconds:
            time.sleep(float(seconds))
    if command not in {h.strip() for h in ENV.get("RUNSC_STANDIN_HANG", "").split(",")}:
        return
    # A child too, so a test can check that the whole process group dies, not just us.
    child = subprocess.Popen(["sleep", "3600"], stdin=subprocess.DEVNULL)
    pids_file = ENV.get("RUNSC_STANDIN_HANG_PIDS")
    if pids_file:
        Path(pids_file).write_text(f"{os.getpid()} {child.pid}\n", encoding="utf-8")
    time.sleep(3600)


def maybe_stall(command: str, positional: list[str]) -> None:
    """The one-shot stall (``RUNSC_STANDIN_STALL``, tests/standins/README.md): when the knob
    file names this command (and container), claim it by renaming it to ``<file>.stalled``
    (so one invocation stalls), write our pid there, wait ``RUNSC_STANDIN_STALL_SECONDS``,
    then carry on with the command as if nothing happened: a command that "lands later"."""
    knob = ENV.get("RUNSC_STANDIN_STALL")
    if not knob:
        return
    try:
        wanted = Path(knob).read_text(encoding="utf-8").split()
    except OSError:
        return
    target = positional[-1] if positional else ""
    if not wanted or wanted[0] != command or (len(wanted) > 1 and wanted[1] != target):
        return
    stalled = Path(knob + ".stalled")
    try:
        Path(knob).rename(stalled)
    except OSError:
        return  # another invocation claimed it
    stalled.write_text(f"{os.getpid()}\n", encoding="utf-8")
    time.sleep(float(ENV.get("RUNSC_STANDIN_STALL_SECONDS", "3600")))


def check_driver(nvproxy: bool) -> None:
    host = ENV.get("RUNSC_STANDIN_HOST_DRIVER")
    if nvproxy and host and host not in DRIVERS:
        raise Fatal(
            "creating container: cannot create sandbox: starting sandbox: "
            f"nvproxy setup: unsupported Nvidia driver version: {host}"
        )


def one_id(rest: list[str], command: str) -> str:
    if len(rest) != 1:
        raise Usage(USAGES.get(command, command))
    return rest[0]


def exists(root: str, cid: str) -> bool:
    return runc(root, "state", cid, check=False).returncode == 0


def check_bundle(bundle: str) -> None:
    spec = Path(bundle) / "config.json"
    try:
        spec.read_bytes()
    except OSError as e:
        raise Fatal(
            f'FetchSpec failed: reading spec: error opening spec file "{spec}": '
            f"open {spec}: {(e.strerror or str(e)).lower()}"
        ) from e


# --- multi-container sandboxes (CRI annotations) ---------------------------------------------
CONTAINER_TYPE = "io.kubernetes.cri.container-type"
SANDBOX_ID = "io.kubernetes.cri.sandbox-id"


def bundle_config(bundle: str) -> dict[str, object]:
    """The bundle's spec (empty when it is gone or unreadable: nothing to join)."""
    try:
        config = json.loads((Path(bundle) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}


def sandbox_of(config: dict[str, object]) -> str | None:
    """The root container a ``container``-type spec joins (None: it boots its own)."""
    annotations = config.get("annotations") or {}
    if isinstance(annotations, dict) and annotations.get(CONTAINER_TYPE) == "container":
        return str(annotations.get(SANDBOX_ID, ""))
    return None


def has_gpu_devices(config: dict[str, object]) -> bool:
    linux = config.get("linux") or {}
    devices = linux.get("devices") or [] if isinstance(linux, dict) else []
    return any(DEVICE_PATTERN.fullmatch(str(d.get("path", ""))) for d in devices)


def booted_file(root: str, sid: str) -> Path:
    """How the sandbox of root container ``sid`` was booted (``{"nvproxy": bool}``)."""
    return Path(root) / f".standin-sandbox-{sid}.json"


def members(root: str, sid: str) -> list[str]:
    """The containers that joined root container ``sid``'s sandbox, in creation order."""
    out = runc(root, "list", "--format", "json", check=False)
    listed = json.loads(out.stdout or "null") or []
    return [
        c["id"]
        for c in sorted(listed, key=lambda c: str(c.get("created", "")))
        if c.get("id") != sid
        and (c.get("annotations") or {}).get(SANDBOX_ID) == sid
        and (c.get("annotations") or {}).get(CONTAINER_TYPE) == "container"
    ]


def join_sandbox(root: str, cid: str, config: dict[str, object]) -> None:
    """A container joining a sandbox needs its root running; a GPU container joining a
    sandbox booted without nvproxy crashes the sentry, as on runsc."""
    sid = sandbox_of(config)
    if sid is None:
        return
    if not sid or not exists(root, sid) or load_state(root, sid).get("status") != "running":
        raise Fatal(
            f'creating container: cannot create container "{cid}": sandbox "{sid}" '
            "is not running (start the sandbox's root container first)"
        )
    booted = booted_file(root, sid)
    nvproxy = booted.is_file() and json.loads(booted.read_text()).get("nvproxy") is True
    if has_gpu_devices(config) and not nvproxy:
        for member in [*members(root, sid), sid]:
            runc(root, "kill", member, "KILL", check=False)
        raise Fatal(
            f'creating container: cannot create container "{cid}": sandbox "{sid}" '
            "crashed: the sentry was booted without nvproxy and the container asks for "
            "NVIDIA devices (pass --nvproxy on the root container's create)"
        )


def cmd_create(root: str, flags: dict[str, str], rest: list[str], nvproxy: bool) -> None:
    cid = one_id(rest, "create")
    check_bundle(flags.get("bundle", "."))
    if exists(root, cid):
        raise Fatal(
            "creating container: cannot lock container metadata file: container already exists"
        )
    check_driver(nvproxy)
    config = bundle_config(flags.get("bundle", "."))
    join_sandbox(root, cid, config)
    if sandbox_of(config) is None:
        Path(root).mkdir(parents=True, exist_ok=True)  # runsc makes a missing --root
        booted_file(root, cid).write_text(json.dumps({"nvproxy": nvproxy}), encoding="utf-8")
    args = ["create", "--bundle", flags.get("bundle", ".")]
    if "pid-file" in flags:
        args += ["--pid-file", flags["pid-file"]]
    runc(root, *args, cid)


def cmd_start(root: str, rest: list[str]) -> None:
    cid = one_id(rest, "start")
    status = load_state(root, cid).get("status")
    if status != "created":
        raise Fatal(f'starting container: cannot start container "{cid}" in state {status}')
    runc(root, "start", cid)


def toggle_cuda(tool: str, pid: int) -> subprocess.CompletedProcess[str]:
    """``<tool> --toggle --pid <pid>``: what runsc runs for each CUDA process."""
    return subprocess.run(
        [tool, "--toggle", "--pid", str(pid)], check=False, text=True, capture_output=True
    )


def suspend_cuda(
    root: str, cid: str, tool: str, holders: list[str], leave_running: bool
) -> list[int]:
    """Toggle every process holding a GPU handle to ``checkpointed``; on a failure toggle back
    the ones already done and fail the checkpoint like runsc (killing the container without
    --leave-running). Returns the toggled pids."""
    toggled: list[int] = []
    for pid in sorted({int(h.split(":", 1)[0]) for h in holders}):
        out = toggle_cuda(tool, pid)
        if out.returncode != 0:
            for done in reversed(toggled):
                toggle_cuda(tool, done)
            if not leave_running:
                runc(root, "kill", cid, "KILL")
                wait_status(root, cid, "stopped")
            detail = (out.stderr or out.stdout).strip() or f"exit status {out.returncode}"
            raise Fatal(
                f'checkpoint failed: checkpointing container "{cid}": '
                f"cuda-checkpoint --toggle --pid {pid} failed: {detail}"
            )
        toggled.append(pid)
    return toggled


def cmd_checkpoint(root: str, flags: dict[str, str], rest: list[str]) -> None:
    cid = one_id(rest, "checkpoint")
    state = load_state(root, cid)
    image_path = flags.get("image-path", "")
    if not image_path:
        raise Fatal("image-path flag must be provided")
    status = state.get("status")
    if status not in ("created", "running", "paused"):
        raise Fatal(f'checkpoint failed: cannot checkpoint container "{cid}" in state {status}')
    leave_running = flags.get("leave-running", "false") == "true"
    image_dir = Path(image_path)
    try:
        image_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise Fatal(
            f"making directories at path provided: mkdir {e.filename}: "
            f"{(e.strerror or str(e)).lower()}"
        ) from e
    image = image_dir / CHECKPOINT_FILE
    try:
        fd = os.open(image, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o644)
    except OSError as e:
        raise Fatal(
            f'checkpoint failed: creating checkpoint state file "{image}": '
            f"open {image}: {(e.strerror or str(e)).lower()}"
        ) from e
    cuda_tool = flags.get("cuda-checkpoint-path")
    cuda_pids: list[int] = []
    # A root container's checkpoint is its whole sandbox's: the joined containers too.
    joined = members(root, cid)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        pids = [p for c in (cid, *joined) for p in container_pids(root, c)]
        holders = live_device_fds(pids)
        if holders and cuda_tool:
            # GPU-aware checkpoint: CUDA state goes to host memory first, then nothing
            # live is left for nvproxy to refuse.
            cuda_pids = suspend_cuda(root, cid, cuda_tool, holders, leave_running)
            holders = []
        if holders:
            # gVisor's save fails part-way; without --leave-running the sandbox is gone.
            if not leave_running:
                stop_sandbox(root, cid, joined)
            if ENV.get("RUNSC_STANDIN_LIVE_CLIENT_ERROR") == "not-restorable":
                cause = (
                    "nvproxy: object handle 0xc1d00001:0x5c000002 (class 0xa06c, "
                    "type *nvproxy.rmAllocObject) is not restorable"
                )
            else:
                cause = "can't save with live nvproxy clients"
            sys.stderr.write(f"standin: nvproxy device handles held: {', '.join(holders)}\n")
            raise Fatal(
                f'checkpoint failed: checkpointing container "{cid}": '
                f"saving kernel state: encoding error: {cause}"
            )
        record = {
            "standin": True,
            "id": cid,
            "bundle": state.get("bundle"),
            "status": status,
            "cuda_checkpoint_path": cuda_tool,
            "cuda_checkpoint_sequential": flags.get("cuda-checkpoint-sequential") == "true",
            "cuda_pids": cuda_pids,
            "containers": joined,
        }
        f.write(json.dumps(record) + "\n")
    if leave_running:
        # The sandbox carries on: its CUDA processes are toggled back to running.
        for pid in cuda_pids:
            out = toggle_cuda(cuda_tool or "", pid)
            if out.returncode != 0:
                detail = (out.stderr or out.stdout).strip()
                raise Fatal(
                    f'checkpoint failed: resuming container "{cid}": '
                    f"cuda-checkpoint --toggle --pid {pid} failed: {detail}"
                )
    else:
        stop_sandbox(root, cid, joined)


def stop_sandbox(root: str, cid: str, joined: list[str]) -> None:
    """The sandbox exits: every container in it stops (their metadata stays until delete)."""
    for member in joined:
        runc(root, "kill", member, "KILL", check=False)
    runc(root, "kill", cid, "KILL")
    for member in joined:
        wait_status(root, member, "stopped")
    wait_status(root, cid, "stopped")


def cmd_restore(root: str, flags: dict[str, str], rest: list[str], nvproxy: bool) -> None:
    cid = one_id(rest, "restore")
    image_path = flags.get("image-path", "")
    if not image_path:
        raise Fatal("image-path flag must be provided")
    check_bundle(flags.get("bundle", "."))
    # A sandbox is restored container by container, each created first (runsc's
    # multi-container restore): a created container is restored in place.
    created = exists(root, cid) and load_state(root, cid).get("status") == "created"
    if exists(root, cid) and not created:
        status = load_state(root, cid).get("status")
        raise Fatal(f'starting container: cannot restore container "{cid}" in state {status}')
    image = Path(image_path) / CHECKPOINT_FILE
    if not image.is_file():
        raise Fatal(
            f'starting container: opening state file "{image}" failed: '
            f"open {image}: no such file or directory"
        )
    check_driver(nvproxy)
    if not created:
        config = bundle_config(flags.get("bundle", "."))
        join_sandbox(root, cid, config)
        args = ["create", "--bundle", flags.get("bundle", ".")]
        if "pid-file" in flags:
            args += ["--pid-file", flags["pid-file"]]
        runc(root, *args, cid)
    runc(root, "start", cid)
    if flags.get("detach", "false") != "true":
        while load_state(root, cid).get("status") != "stopped":
            time.sleep(0.05)


def cmd_exec(root: str, flags: dict[str, str], rest: list[str]) -> int:
    if len(rest) < 2:
        raise Usage(USAGES["exec"])
    cid, command = rest[0], rest[1:]
    status = load_state(root, cid).get("status")
    if status not in ("created", "running"):
        raise Fatal(
            f'executing processes for container: cannot execute in container "{cid}" '
            f"in state {status}"
        )
    args = ["exec"]
    if flags.get("detach") == "true":
        args.append("--detach")
    for name in ("cwd", "env", "user", "pid-file"):
        if name in flags:
            args += [f"--{name}", flags[name]]
    # The command's stdio and exit status are ours, as with runsc exec.
    return subprocess.run([RUNC, "--root", root, *args, cid, *command], check=False).returncode


def cmd_state(root: str, rest: list[str]) -> None:
    cid = one_id(rest, "state")
    state = load_state(root, cid)
    keys = ("ociVersion", "id", "status", "pid", "bundle", "annotations")
    shown = {k: state[k] for k in keys if k in state}
    if shown.get("status") == "running" and paused_file(root, cid).exists():
        shown["status"] = "paused"
    if shown.get("status") == "stopped":
        shown["pid"] = -1  # runsc's "no process" (runc says 0)
    sys.stdout.write(json.dumps(shown, indent=2))


def cmd_kill(root: str, flags: dict[str, str], rest: list[str]) -> None:
    if not 1 <= len(rest) <= 2:
        raise Usage(USAGES["kill"])
    cid, signal = rest[0], (rest[1] if len(rest) == 2 else "TERM")
    load_state(root, cid)
    runc(root, "kill", *(["--all"] if flags.get("all") == "true" else []), cid, signal)


def cmd_delete(root: str, flags: dict[str, str], rest: list[str]) -> None:
    if not rest:
        raise Usage(USAGES["delete"])
    force = flags.get("force") == "true"
    for cid in rest:
        if force and not exists(root, cid):
            continue  # runsc: delete --force of an unknown id succeeds
        state = load_state(root, cid)
        if state.get("status") != "stopped" and not force:
            raise Fatal("cannot delete container that is not stopped without --force flag")
        sid = sandbox_of(bundle_config(str(state.get("bundle", "."))))
        if sid and (not exists(root, sid) or load_state(root, sid).get("status") == "stopped"):
            # Its sandbox exited: runsc cannot reach it to destroy the container.
            raise Fatal(
                f'destroying container: stopping container: destroying container "{cid}": '
                "connecting to control server at PID 0: connection refused"
            )
        if sid is None:
            # The root container's delete tears the whole sandbox down.
            for member in members(root, cid):
                runc(root, "delete", "--force", member, check=False)
            booted_file(root, cid).unlink(missing_ok=True)
            paused_file(root, cid).unlink(missing_ok=True)
        runc(root, "delete", *(["--force"] if force else []), cid)


def paused_file(root: str, sid: str) -> Path:
    """Marks root container ``sid``'s sandbox paused (``pause``/``resume``)."""
    return Path(root) / f".standin-paused-{sid}"


def cmd_pause(root: str, rest: list[str], *, resume: bool) -> None:
    """``pause``/``resume``: of a root container, every container of its sandbox (runsc
    freezes the whole sentry). Each container's init gets SIGSTOP/SIGCONT, and the sandbox
    is marked paused (``state`` says so): not runc's freezer, which freezes a whole cgroup,
    and test bundles share cgroup paths (every ``app`` container is runc's ``/app``)."""
    verb = "resume" if resume else "pause"
    cid = one_id(rest, verb)
    state = load_state(root, cid)
    status = "paused" if paused_file(root, cid).exists() else state.get("status")
    if status != ("paused" if resume else "running"):
        raise Fatal(f'{verb} failed: cannot {verb} container "{cid}" in state {status}')
    joined = sandbox_of(bundle_config(str(state.get("bundle", "."))))
    targets = [cid] if joined is not None else [cid, *members(root, cid)]
    for target in targets:
        # A member that already exited (stopped) has nothing to stop or continue.
        runc(root, "kill", target, "CONT" if resume else "STOP", check=target == cid)
    if resume:
        paused_file(root, cid).unlink(missing_ok=True)
    else:
        paused_file(root, cid).touch()


def cmd_ps(root: str, flags: dict[str, str], rest: list[str]) -> None:
    cid = one_id(rest, "ps")
    load_state(root, cid)
    pids = container_pids(root, cid)
    if flags.get("format") == "json":
        sys.stdout.write(json.dumps(pids) + "\n")
    else:
        sys.stdout.write("PID\n" + "".join(f"{p}\n" for p in pids))


def print_defaults(known: dict[str, bool]) -> str:
    lines = []
    for name in sorted(known):
        kind = " string" if known[name] else ""
        lines.append(f"  -{name}{kind}\n    \t{FLAG_HELP.get(name, name)}\n")
    return "".join(lines)


def cmd_help(rest: list[str]) -> None:
    if not rest:
        commands = sorted(c for c in COMMAND_FLAGS if c != "nvproxy")
        if "nvproxy-list" in FEATURES:
            commands.append("nvproxy")
        sys.stdout.write(
            "Usage: runsc <flags> <subcommand> <subcommand args>\n\nSubcommands:\n"
            + "".join(f"\t{c:<15}  {c}\n" for c in commands)
            + '\nUse "runsc flags" for a list of top-level flags\n'
        )
        return
    command = rest[0]
    if command not in USAGES:
        sys.stderr.write(f"Subcommand {command} not understood\n")
        raise SystemExit(2)
    sys.stdout.write(USAGES[command] + "\n" + print_defaults(COMMAND_FLAGS[command]))


def cmd_nvproxy(rest: list[str]) -> None:
    if "nvproxy-list" not in FEATURES:
        raise Usage("Unknown command: nvproxy")
    if rest != ["list-supported-drivers"]:
        raise Usage("nvproxy <subcommand>: list-supported-drivers")
    sys.stdout.write("".join(f"{d}\n" for d in DRIVERS))


def _dispatch(argv: list[str]) -> int:
    global_flags, rest = parse_flags(argv[1:], GLOBAL_FLAGS)
    if global_flags.get("version") == "true":
        sys.stdout.write(f"runsc version {VERSION}\nspec: 1.1.0-rc.1\n")
        return 0
    if not rest:
        raise Usage("Usage: runsc <flags> <subcommand> <subcommand args>")
    command, args = rest[0], rest[1:]
    if command not in COMMAND_FLAGS:
        raise Usage(f"Unknown command: {command}")
    maybe_hang(command)
    flags, positional = parse_flags(args, COMMAND_FLAGS[command])
    maybe_stall(command, positional)
    root = global_flags.get("root", "/var/run/runsc")
    nvproxy = global_flags.get("nvproxy", "false") == "true"
    if command == "create":
        cmd_create(root, flags, positional, nvproxy)
    elif command == "start":
        cmd_start(root, positional)
    elif command == "checkpoint":
        cmd_checkpoint(root, flags, positional)
    elif command == "restore":
        cmd_restore(root, flags, positional, nvproxy)
    elif command == "state":
        cmd_state(root, positional)
    elif command == "exec":
        return cmd_exec(root, flags, positional)
    elif command == "kill":
        cmd_kill(root, flags, positional)
    elif command == "delete":
        cmd_delete(root, flags, positional)
    elif command in ("pause", "resume"):
        cmd_pause(root, positional, resume=command == "resume")
    elif command == "ps":
        cmd_ps(root, flags, positional)
    elif command == "help":
        cmd_help(positional)
    elif command == "flags":
        sys.stdout.write(print_defaults(GLOBAL_FLAGS))
    elif command == "nvproxy":
        cmd_nvproxy(positional)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run one runsc command; ``argv`` is the full command line (program name first)."""
    argv = list(sys.argv if argv is None else argv)
    log_argv(argv)
    try:
        return _dispatch(argv)
    except Usage as e:
        sys.stderr.write(f"{e}\n")
        return 2
    except Fatal as e:
        sys.stderr.write(f"{e}\n")
        return 128


if __name__ == "__main__":
    sys.exit(main())
