"""Building a simulated GPU node in a directory.

Layout (``root`` plays the host's ``/`` for ``--dev-root``)::

    root/dev/nvidia0…N, nvidiactl, nvidia-uvm, nvidia-uvm-tools   char devices (mknod)
    root/usr/local/nvidia/lib64/lib*.so.<version>                real ELF shared objects
    root/usr/local/nvidia/bin/nvidia-smi                          a tiny script
    root/opt/nvidia-toolkit/nvidia-ctk (+ .real), nvidia-cdi-hook  the toolkit stand-ins

Device nodes use NVIDIA's real numbers (195 for ``nvidiaN`` and ``nvidiactl``; a dynamic
major for ``nvidia-uvm``), so opening one in a container passes the cgroup and then fails
with ENXIO, exactly as on a node whose driver is not loaded. Creating them needs root;
without it they are symlinks to ``/dev/null`` (a real char device, 1:3), which keeps
every code path real at the cost of distinct numbers.

Libraries are built with the system C compiler (``cc``/``gcc``) so they carry real
``DT_SONAME`` entries; one object file is compiled and linked once per SONAME.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from substrate_gpu import exceptions
from substrate_gpu.testing import nvidia_ctk

NVIDIA_MAJOR = 195
NVIDIACTL_MINOR = 255
UVM_MAJOR = 235  # dynamic on real nodes; unused by any driver on a test machine

#: (file name pattern, SONAME pattern); ``{v}`` is the driver version. Mirrors a real
#: driver: most libraries have a ``.so.1`` SONAME, a few are their own SONAME.
DEFAULT_LIBRARIES: tuple[tuple[str, str], ...] = (
    ("libcuda.so.{v}", "libcuda.so.1"),
    ("libcudadebugger.so.{v}", "libcudadebugger.so.1"),
    ("libnvidia-ml.so.{v}", "libnvidia-ml.so.1"),
    ("libnvidia-ptxjitcompiler.so.{v}", "libnvidia-ptxjitcompiler.so.1"),
    ("libnvidia-nvvm.so.{v}", "libnvidia-nvvm.so.4"),
    ("libnvidia-opencl.so.{v}", "libnvidia-opencl.so.1"),
    ("libnvidia-allocator.so.{v}", "libnvidia-allocator.so.1"),
    ("libnvidia-cfg.so.{v}", "libnvidia-cfg.so.1"),
    ("libnvidia-gpucomp.so.{v}", "libnvidia-gpucomp.so.{v}"),
    ("libnvidia-tls.so.{v}", "libnvidia-tls.so.{v}"),
)

_LIBRARY_SOURCE = """
const char *substrate_gpu_sim_library(void) { return SIM_SONAME; }
"""


@dataclass(frozen=True)
class SimulatedNode:
    """A node tree built by :func:`build_node`."""

    root: Path
    """Plays the host's ``/`` (pass as ``dev_root``)."""
    driver_root: Path
    """``root/usr/local/nvidia``."""
    toolkit_dir: Path
    """``root/opt/nvidia-toolkit`` (the worker's mounted toolkit)."""
    gpus: tuple[int, ...]
    """GPU indices present as ``dev/nvidiaN``."""
    driver_version: str
    """The simulated driver version."""
    real_device_nodes: bool
    """True when device nodes are real mknod char devices."""

    @property
    def lib64(self) -> Path:
        """The driver library directory."""
        return self.driver_root / "lib64"

    @property
    def hook_log(self) -> Path:
        """Where the nvidia-cdi-hook stand-in records its invocations."""
        return self.toolkit_dir / "hook-invocations.jsonl"


def find_compiler() -> str:
    """The C compiler used to build libraries; a clear error when there is none."""
    for name in ("cc", "gcc"):
        found = shutil.which(name)
        if found:
            return found
    raise exceptions.ConfigError(
        "while building a simulated GPU node: no C compiler (cc or gcc) on PATH; "
        "install gcc to build the simulated driver libraries"
    )


def build_libraries(
    directory: Path, libraries: tuple[tuple[str, str], ...], *, version: str
) -> list[Path]:
    """Build real ELF shared objects with the given file names and SONAMEs."""
    compiler = find_compiler()
    directory.mkdir(parents=True, exist_ok=True)
    built: list[Path] = []
    with tempfile.TemporaryDirectory(prefix="substrate-gpu-cc-") as tmp:
        source = Path(tmp) / "lib.c"
        source.write_text(_LIBRARY_SOURCE)
        objects: dict[str, Path] = {}
        for name_pattern, soname_pattern in libraries:
            name, soname = name_pattern.format(v=version), soname_pattern.format(v=version)
            obj = objects.get(soname)
            if obj is None:
                obj = Path(tmp) / f"{len(objects)}.o"
                _run(
                    [
                        compiler,
                        "-c",
                        "-fPIC",
                        f'-DSIM_SONAME="{soname}"',
                        "-o",
                        str(obj),
                        str(source),
                    ]
                )
                objects[soname] = obj
            out = directory / name
            _run([compiler, "-shared", f"-Wl,-soname,{soname}", "-o", str(out), str(obj)])
            built.append(out)
    return built


def _run(argv: list[str]) -> None:
    result = subprocess.run(argv, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise exceptions.ConfigError(
            f"while building a simulated GPU node: {' '.join(argv)} failed: {result.stderr.strip()}"
        )


def _make_device(path: Path, major: int, minor: int, *, real: bool) -> None:
    if real:
        os.mknod(path, 0o666 | 0o020000, os.makedev(major, minor))  # S_IFCHR
        path.chmod(0o666)
    else:
        path.symlink_to("/dev/null")


def _write_script(path: Path, body: str) -> None:
    path.write_text(body)
    path.chmod(0o755)


def install_toolkit_standins(toolkit_dir: Path) -> None:
    """Install ``nvidia-ctk`` (a wrapper script), ``nvidia-ctk.real`` and ``nvidia-cdi-hook``.

    The wrapper mirrors the real packaging, where ``nvidia-ctk`` is a shell wrapper around
    ``nvidia-ctk.real``; the ``.real`` files run the Python stand-ins with this interpreter.
    """
    toolkit_dir.mkdir(parents=True, exist_ok=True)
    prelude = (
        "#!/bin/sh\n"
        f"PYTHONPATH={Path(__file__).resolve().parents[2]}${{PYTHONPATH:+:$PYTHONPATH}}\n"
        "export PYTHONPATH\n"
    )
    run = f"exec {sys.executable} -m substrate_gpu.testing"
    log = toolkit_dir / "hook-invocations.jsonl"
    _write_script(toolkit_dir / "nvidia-ctk.real", f'{prelude}{run}.nvidia_ctk "$@"\n')
    _write_script(
        toolkit_dir / "nvidia-cdi-hook.real",
        f"{prelude}export NVIDIA_CDI_HOOK_STANDIN_LOG=${{NVIDIA_CDI_HOOK_STANDIN_LOG:-{log}}}\n"
        f'{run}.nvidia_cdi_hook "$0" "$@"\n',
    )
    for name in ("nvidia-ctk", "nvidia-cdi-hook"):
        real = toolkit_dir / f"{name}.real"
        _write_script(toolkit_dir / name, f'#!/bin/sh\n# packaging wrapper\nexec "{real}" "$@"\n')


def install_runsc_standin(directory: Path) -> Path:
    """Install ``runsc``: a wrapper running the stand-in script ``runsc.py`` (over runc).

    Installed next to the toolkit stand-ins by the demo, so an installed package (no tests/
    tree) can drive the production runsc driver against it. The script is run by its path,
    not as a module: it imports nothing of the package, so each runsc command starts as
    fast as a bare interpreter. Returns the wrapper's path.
    """
    directory.mkdir(parents=True, exist_ok=True)
    script = directory / "runsc"
    _write_script(
        script,
        f'#!/bin/sh\nexec {sys.executable} {Path(__file__).with_name("runsc.py")} "$@"\n',
    )
    return script


#: The runsc subcommands a stalling wrapper recognises (the first of them in argv is the one).
_STALLABLE = "create start restore checkpoint delete state kill exec"


def install_stalling_runsc(real: Path, directory: Path) -> Path:
    """Install ``runsc``: a ``/bin/sh`` wrapper that execs ``real`` with its arguments, after
    stalling once where the ``RUNSC_STANDIN_STALL`` knob file says (the stand-in's knob,
    tests/standins/README.md, for a runsc that cannot stall itself: real gVisor).

    The knob file holds ``<subcommand> [<container id>]``; the first invocation it names
    claims it (renamed to ``<file>.stalled``, holding the wrapper's pid), waits
    ``RUNSC_STANDIN_STALL_SECONDS`` (default 3600) in 0.1 s sleeps (so no long-lived
    ``sleep`` outlives a killed wrapper), then execs ``real``: the command lands late,
    unless the wrapper was killed meanwhile. Returns the wrapper's path.
    """
    directory.mkdir(parents=True, exist_ok=True)
    script = directory / "runsc"
    _write_script(
        script,
        "#!/bin/sh\n"
        'knob="${RUNSC_STANDIN_STALL:-}"\n'
        'if [ -n "$knob" ] && [ -f "$knob" ]; then\n'
        '  read -r want_cmd want_id < "$knob" || true\n'
        '  cmd=; for a in "$@"; do\n'
        f'    case " {_STALLABLE} " in *" $a "*) cmd=$a; break;; esac\n'
        "  done\n"
        '  for last in "$@"; do :; done\n'
        '  if [ -n "$cmd" ] && [ "$cmd" = "$want_cmd" ] '
        '&& { [ -z "$want_id" ] || [ "$want_id" = "$last" ]; } '
        '&& mv "$knob" "$knob.stalled" 2>/dev/null; then\n'
        '    echo $$ > "$knob.stalled"\n'
        '    n=$(awk "BEGIN { print int(${RUNSC_STANDIN_STALL_SECONDS:-3600} * 10) }")\n'
        '    i=0; while [ "$i" -lt "$n" ]; do sleep 0.1; i=$((i+1)); done\n'
        "  fi\n"
        "fi\n"
        f'exec {real} "$@"\n',
    )
    return script


def _nvidia_smi(root: Path, gpus: tuple[int, ...], driver_version: str) -> str:
    """A simulated ``nvidia-smi``: ``-L`` lists the GPUs whose ``/dev/nvidiaN`` exist where it
    runs (in a container: the ones injected, as nvproxy shows a sandbox its own), by the
    UUIDs the nvidia-ctk stand-in gives them; the memory query answers every GPU of the node
    (nothing used, 80 GiB free); anything else prints the banner."""
    uuids = {i: nvidia_ctk.gpu_uuid(root, i) for i in gpus}
    listing = "".join(
        f'[ -e /dev/nvidia{i} ] && echo "GPU $n: Simulated GPU (UUID: {u})" && n=$((n+1))\n'
        for i, u in sorted(uuids.items())
    )
    memory = "".join(f"echo '{u}, 0, 81920'\n" for _, u in sorted(uuids.items()))
    return (
        "#!/bin/sh\n"
        'case "$1" in\n'
        f"-L) n=0\n{listing}exit 0;;\n"
        f"--query-gpu=uuid,memory.used,memory.free) {memory}exit 0;;\n"
        "esac\n"
        f"echo 'NVIDIA-SMI {driver_version} (simulated node: no GPU attached)'\n"
    )


def build_node(
    root: Path,
    *,
    gpus: tuple[int, ...] = (0,),
    driver_version: str = "580.65.06",
    libraries: tuple[tuple[str, str], ...] = DEFAULT_LIBRARIES,
    real_device_nodes: bool | None = None,
    openable_devices: bool = False,
) -> SimulatedNode:
    """Create a simulated GPU node under ``root`` (which must be empty or absent).

    ``openable_devices`` gives every NVIDIA node the numbers of ``/dev/null`` (1:3), so a
    workload in an actor can really hold a GPU handle open (a "live CUDA context" that the
    fd probe and the runsc stand-in can see); NVIDIA's own numbers would fail with ENXIO.
    """
    real = os.geteuid() == 0 if real_device_nodes is None else real_device_nodes

    def numbers(major: int, minor: int) -> tuple[int, int]:
        return (1, 3) if openable_devices else (major, minor)

    dev = root / "dev"
    dev.mkdir(parents=True, exist_ok=True)
    for index in gpus:
        _make_device(dev / f"nvidia{index}", *numbers(NVIDIA_MAJOR, index), real=real)
    _make_device(dev / "nvidiactl", *numbers(NVIDIA_MAJOR, NVIDIACTL_MINOR), real=real)
    _make_device(dev / "nvidia-uvm", *numbers(UVM_MAJOR, 0), real=real)
    _make_device(dev / "nvidia-uvm-tools", *numbers(UVM_MAJOR, 1), real=real)

    driver_root = root / "usr/local/nvidia"
    build_libraries(driver_root / "lib64", libraries, version=driver_version)
    bin_dir = driver_root / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    _write_script(bin_dir / "nvidia-smi", _nvidia_smi(root, gpus, driver_version))
    toolkit_dir = root / "opt/nvidia-toolkit"
    install_toolkit_standins(toolkit_dir)
    return SimulatedNode(
        root=root,
        driver_root=driver_root,
        toolkit_dir=toolkit_dir,
        gpus=tuple(gpus),
        driver_version=driver_version,
        real_device_nodes=real,
    )
