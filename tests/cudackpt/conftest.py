"""Fixtures for cuda-checkpoint tests: the stand-in tool, host processes that "hold a GPU",
and real runc containers running the stand-in inside them through ``runsc exec``.

How the stand-in runs *inside* a busybox container (it is Python; busybox has none): the
host's ``/usr`` is bind-mounted **read-only** at ``/usr`` (with ``/lib``, ``/lib64`` links
as on the merged-/usr host), so ``/usr/bin/python3`` and its standard library are there,
and ``tests/standins`` is bind-mounted read-only at ``/opt/standins``. The tool then runs
where the real one would — in the container's pid namespace, on container pids, through
the runtime's exec — and its state directory is a read-write bind the test can read.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import pytest
from support import runc_bundle

from cudackpt.sandbox import (
    CUDA_CHECKPOINT,
    GPU_WORKER,
    INIT,
    RUNSC,
    STANDINS,
    STATE_IN_CONTAINER,
    standin_env,
)
from substrate_gpu.runsc import driver


@pytest.fixture
def ckpt_state(tmp_path: Path) -> Path:
    """The stand-in's state directory."""
    path = tmp_path / "cuda-ckpt-state"
    path.mkdir()
    return path


class FakeGpuProcess:
    """A host process holding a file named like a GPU node (matched by a test pattern)."""

    PATTERN = r".*/fake-nvidia0"

    def __init__(self, directory: Path) -> None:
        node = directory / "fake-nvidia0"
        node.touch()
        script = (
            f"exec 3<{node}; trap 'exec 3<&-' USR1; trap 'exec 3<{node}' USR2; "
            "while true; do sleep 0.05; done"
        )
        self.proc = subprocess.Popen(["/bin/sh", "-c", script])
        self.pid = self.proc.pid
        try:
            for _ in range(200):
                if self._holds_node():
                    break
                subprocess.run(["sleep", "0.01"], check=True)
        except BaseException:
            self.stop()  # never leak the shell (an unwaited Popen fails the next test)
            raise

    def _holds_node(self) -> bool:
        for fd in os.listdir(f"/proc/{self.pid}/fd"):
            try:
                target = os.readlink(f"/proc/{self.pid}/fd/{fd}")
            except FileNotFoundError:  # the shell closed it between listdir and readlink
                continue
            if target.endswith("fake-nvidia0"):
                return True
        return False

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


@pytest.fixture
def gpu_process(tmp_path: Path) -> Iterator[FakeGpuProcess]:
    """A host process 'holding a GPU' (see FakeGpuProcess.PATTERN)."""
    proc = FakeGpuProcess(tmp_path)
    yield proc
    proc.stop()


@pytest.fixture
def run_standin(ckpt_state: Path) -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run the stand-in on the host with the fake-GPU pattern and extra knobs."""

    def run(*args: str, **knobs: str) -> subprocess.CompletedProcess[str]:
        env = standin_env(
            ckpt_state, CUDA_CHECKPOINT_STANDIN_DEVICE_PATTERN=FakeGpuProcess.PATTERN, **knobs
        )
        return subprocess.run(
            [str(CUDA_CHECKPOINT), *args],
            check=False,
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
        )

    return run


# -- real containers ------------------------------------------------------------------------


@pytest.fixture
def runsc_root(tmp_path: Path, runc_path: str) -> Iterator[Path]:
    """A runsc/runc state root; every container is force-deleted at teardown."""
    root = tmp_path / "runsc-root"
    root.mkdir()
    yield root
    runc_bundle.delete_all(root, runc=runc_path)


@pytest.fixture
def runtime(runsc_root: Path) -> driver.RunscDriver:
    """RunscDriver over the stand-in runsc, short timeouts."""
    return driver.RunscDriver(
        driver.RunscConfig(
            root=runsc_root,
            runsc=str(RUNSC),
            timeouts=driver.Timeouts(create=20, start=10, checkpoint=30, restore=20, exec=20),
        )
    )


def _add_ro_bind(config: dict[str, object], source: str, dest: str) -> None:
    mounts = config["mounts"]
    assert isinstance(mounts, list)
    mounts.append(
        {
            "destination": dest,
            "type": "bind",
            "source": source,
            "options": ["rbind", "ro", "nosuid"],
        }
    )


@pytest.fixture
def make_gpu_bundle(tmp_path: Path, runc_path: str) -> Callable[..., tuple[Path, Path]]:
    """Build a bundle running two GPU workers (pid 1 and a child) with the stand-in inside.

    Returns (bundle, state dir on the host). ``knobs`` become the container's environment,
    which ``runsc exec`` (runc exec) hands to the exec'd stand-in.
    """

    def make(name: str = "bundle", knobs: Mapping[str, str] | None = None) -> tuple[Path, Path]:
        state = tmp_path / f"{name}-state"
        state.mkdir()
        env = [
            f"CUDA_CHECKPOINT_STANDIN_STATE={STATE_IN_CONTAINER}",
            "CUDA_CHECKPOINT_STANDIN_RELEASE_SIGNAL=USR1",
            "CUDA_CHECKPOINT_STANDIN_REACQUIRE_SIGNAL=USR2",
            *(f"{k}={v}" for k, v in (knobs or {}).items()),
        ]
        bundle = runc_bundle.make_busybox_bundle(
            tmp_path / name,
            ["/bin/sh", "-c", INIT],
            env=env,
            devices=[runc_bundle.DeviceNode("/dev/nvidia0")],
            binds=[(state, STATE_IN_CONTAINER)],
            runc=runc_path,
        )
        rootfs = bundle / "rootfs"
        (rootfs / "gpu-worker.sh").write_text(GPU_WORKER)
        for sub in ("usr", "opt/standins"):
            (rootfs / sub).mkdir(parents=True, exist_ok=True)
        for link in ("lib", "lib64"):
            host = Path("/") / link
            if host.is_symlink():
                (rootfs / link).symlink_to(os.readlink(host))
            elif host.is_dir():
                (rootfs / link).mkdir(exist_ok=True)
        config_path = bundle / "config.json"
        config = json.loads(config_path.read_text())
        _add_ro_bind(config, "/usr", "/usr")
        for link in ("lib", "lib64"):
            if (Path("/") / link).is_dir() and not (Path("/") / link).is_symlink():
                _add_ro_bind(config, f"/{link}", f"/{link}")
        _add_ro_bind(config, str(STANDINS), "/opt/standins")
        config_path.write_text(json.dumps(config, indent=2))
        return bundle, state

    return make
