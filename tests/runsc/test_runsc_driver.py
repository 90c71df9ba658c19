"""RunscDriver against the stand-in runsc: feature detection, state parsing, failures, hangs."""

from __future__ import annotations

import hashlib
import os
import subprocess
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import anyio
import pytest

from substrate_gpu.runsc import api, driver

STANDIN = Path(__file__).resolve().parents[1] / "standins" / "runsc"

pytestmark = pytest.mark.anyio

MakeDriver = Callable[..., driver.RunscDriver]


@pytest.mark.parametrize(
    ("features_env", "expected"),
    [
        pytest.param(
            None,
            (True, True, True, True),
            id="modern-runsc",
        ),
        pytest.param("", (False, False, False, False), id="old-runsc"),
        pytest.param("leave-running", (True, False, False, False), id="leave-running-only"),
        pytest.param(
            "leave-running,cuda-checkpoint-path",
            (True, True, False, False),
            id="cuda-checkpoint-without-nvproxy-cli",
        ),
        pytest.param(
            "nvproxy-list,nvproxy-driver-version",
            (False, False, True, True),
            id="nvproxy-cli-without-leave-running",
        ),
    ],
)
async def test_features_are_detected_from_runsc_itself(
    make_driver: MakeDriver,
    monkeypatch: pytest.MonkeyPatch,
    features_env: str | None,
    expected: tuple[bool, bool, bool, bool],
) -> None:
    """Each feature is read from --version / help / flags output, not assumed."""
    if features_env is not None:
        monkeypatch.setenv("RUNSC_STANDIN_FEATURES", features_env)
    features = await make_driver().features()
    assert (
        features.leave_running,
        features.cuda_checkpoint_path,
        features.list_supported_drivers,
        features.nvproxy_driver_version,
    ) == expected


@pytest.mark.parametrize(
    ("features_env", "expected"),
    [
        pytest.param("leave-running,cuda-checkpoint-path", False, id="without"),
        pytest.param(
            "leave-running,cuda-checkpoint-path,cuda-checkpoint-sequential", True, id="with"
        ),
    ],
)
async def test_sequential_cuda_checkpoint_is_detected_from_help_checkpoint(
    make_driver: MakeDriver,
    monkeypatch: pytest.MonkeyPatch,
    features_env: str,
    expected: bool,
) -> None:
    """``checkpoint --cuda-checkpoint-sequential`` is used only where ``runsc help
    checkpoint`` lists it."""
    monkeypatch.setenv("RUNSC_STANDIN_FEATURES", features_env)
    assert (await make_driver().features()).cuda_checkpoint_sequential is expected


async def test_features_carry_the_sha256_of_the_runsc_binary(make_driver: MakeDriver) -> None:
    """The hash a checkpoint manifest records is the runsc executable's own."""
    runtime = make_driver()
    want = hashlib.sha256(Path(runtime.config.runsc).read_bytes()).hexdigest()
    assert (await runtime.features()).binary_sha256 == want


def test_an_unreadable_runsc_binary_has_no_hash(tmp_path: Path) -> None:
    """A runsc that cannot be read hashes to empty (its --version fails first, typed)."""
    facts = driver.scan_binary(str(tmp_path / "no-runsc"))
    assert (facts.sha256, facts.restore_creates_gpu_device_files) == ("", None)


@pytest.mark.parametrize(
    ("symbols", "expected"),
    [
        pytest.param([driver.RESTORE_DEVICE_FILES_FIXED], True, id="gvisor-14525"),
        pytest.param([driver.RESTORE_DEVICE_FILES_REMAP_GATED], False, id="remap-gated-only"),
        # Mid-way builds cannot exist (the fix removes the gated function); the fix wins.
        pytest.param(
            [driver.RESTORE_DEVICE_FILES_REMAP_GATED, driver.RESTORE_DEVICE_FILES_FIXED],
            True,
            id="both",
        ),
        pytest.param([b"boot.(*Loader).somethingElse"], None, id="neither"),
    ],
)
def test_restore_device_files_are_detected_from_the_binary(
    tmp_path: Path, symbols: list[bytes], expected: bool | None
) -> None:
    """The symbol names in the executable decide, wherever they lie: here each straddles a
    1 MiB read boundary (the scan reads the file in 1 MiB blocks)."""
    binary = tmp_path / "runsc"
    with binary.open("wb") as f:
        for index, symbol in enumerate(symbols):
            f.seek((index + 1) * (1 << 20) - len(symbol) // 2)
            f.write(symbol)
        f.write(b"\0" * 100)
    facts = driver.scan_binary(str(binary))
    assert facts.restore_creates_gpu_device_files is expected
    assert facts.sha256 == hashlib.sha256(binary.read_bytes()).hexdigest()


@pytest.mark.parametrize(
    ("flags", "legacy"),
    [
        pytest.param(
            "  -nvproxy\n    \tLEGACY: enable support for Nvidia GPUs. GPU support gets"
            " automatically enabled if Nvidia devices are present in the OCI spec.\n"
            "  -nvproxy-docker\n    \tLEGACY: Injects nvidia-container-runtime-hook\n",
            True,
            id="pinned-gvisor",
        ),
        pytest.param(
            "  -nvproxy\n    \tEnable support for Nvidia GPUs.\n"
            "  -nvproxy-docker\n    \tLEGACY: Injects nvidia-container-runtime-hook\n",
            False,
            id="older-runsc",
        ),
        pytest.param("  -network string\n    \tnetwork\n", False, id="no-nvproxy-flag"),
    ],
)
def test_the_nvproxy_flag_is_read_as_legacy_from_its_own_usage_line(
    flags: str, legacy: bool
) -> None:
    """Only --nvproxy's own description counts (--nvproxy-docker is legacy everywhere)."""
    assert driver.nvproxy_flag_is_legacy(flags) is legacy


async def test_version_is_the_first_line_of_runsc_version(
    make_driver: MakeDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The version reported is runsc's own first line."""
    monkeypatch.setenv("RUNSC_STANDIN_VERSION", "release-20240101.0")
    assert (await make_driver().features()).version == "runsc version release-20240101.0"


async def test_features_are_detected_once(make_driver: MakeDriver, argv_log) -> None:
    """A second call answers from the cache without running runsc."""
    runtime = make_driver()
    first = await runtime.features()
    calls = len(argv_log.entries())
    assert await runtime.features() is first
    assert len(argv_log.entries()) == calls


async def test_failed_detection_is_not_cached(tmp_path: Path) -> None:
    """A runsc that cannot run now is asked again next time."""
    link = tmp_path / "runsc"
    runtime = driver.RunscDriver(driver.RunscConfig(root=tmp_path, runsc=str(link)))
    with pytest.raises(api.RunscError, match="while detecting the features of"):
        await runtime.features()
    link.symlink_to(STANDIN)  # runsc gets installed
    assert (await runtime.features()).leave_running


async def test_list_supported_drivers(
    make_driver: MakeDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The driver versions are runsc's list, one per line."""
    monkeypatch.setenv("RUNSC_STANDIN_DRIVERS", "550.90.07,570.133.20")
    assert await make_driver().list_supported_drivers() == ("550.90.07", "570.133.20")


async def test_list_supported_drivers_without_the_command(
    make_driver: MakeDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An old runsc without 'nvproxy list-supported-drivers' gets a clear error."""
    monkeypatch.setenv("RUNSC_STANDIN_FEATURES", "leave-running")
    with pytest.raises(api.RunscError, match="no 'nvproxy list-supported-drivers'"):
        await make_driver().list_supported_drivers()


@pytest.mark.parametrize(
    ("stdout", "problem"),
    [
        pytest.param("", "invalid JSON", id="empty"),
        pytest.param("FATAL: boom", "invalid JSON", id="not-json"),
        pytest.param("[1, 2]", "not an object", id="not-an-object"),
        pytest.param('{"status": "running", "pid": 1, "bundle": "/b"}', "no string 'id'", id="id"),
        pytest.param(
            '{"id": "a1", "status": "exploded", "pid": 1, "bundle": "/b"}',
            "unknown 'status'",
            id="status",
        ),
        pytest.param(
            '{"id": "a1", "status": "running", "pid": "1", "bundle": "/b"}',
            "invalid 'pid'",
            id="pid-string",
        ),
        pytest.param(
            '{"id": "a1", "status": "running", "pid": true, "bundle": "/b"}',
            "invalid 'pid'",
            id="pid-bool",
        ),
        pytest.param('{"id": "a1", "status": "running", "pid": 1}', "'bundle'", id="bundle"),
    ],
)
def test_garbage_state_is_a_clear_error(stdout: str, problem: str) -> None:
    """Unparseable `runsc state` output names the container and the problem."""
    with pytest.raises(api.RunscError, match=problem) as info:
        driver.parse_state("a1", stdout)
    assert str(info.value).startswith("while querying the state of container a1: ")


def test_state_keeps_the_documented_fields() -> None:
    """id, status, pid and bundle are read; extra fields are ignored."""
    state = driver.parse_state(
        "a1",
        '{"ociVersion": "1.0.2", "id": "a1", "status": "running", "pid": 42, "bundle": "/b"}',
    )
    assert state == api.ContainerState(id="a1", status="running", pid=42, bundle="/b")


async def test_unknown_container_is_not_found(make_driver: MakeDriver, runc_root: Path) -> None:
    """State of a container runsc does not know raises ContainerNotFoundError."""
    with pytest.raises(api.ContainerNotFoundError, match="while querying the state of container"):
        await make_driver().state("nope")


async def test_missing_runsc_binary(tmp_path: Path) -> None:
    """A runsc that cannot be started is a RunscError saying so."""
    runtime = driver.RunscDriver(driver.RunscConfig(root=tmp_path, runsc=str(tmp_path / "no")))
    with pytest.raises(api.RunscError, match="while starting container a1: cannot start"):
        await runtime.start("a1")


async def test_unsupported_driver_on_create(
    make_driver: MakeDriver, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """nvproxy refusing the host driver maps to UnsupportedDriverError."""
    monkeypatch.setenv("RUNSC_STANDIN_HOST_DRIVER", "999.1.2")
    (tmp_path / "config.json").write_text("{}")  # runsc reads the spec before booting nvproxy
    with pytest.raises(api.UnsupportedDriverError, match="while creating container a1"):
        await make_driver().create("a1", tmp_path, nvproxy=True)


def _gone(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rpartition(")")[2].split()[0] in {"Z", "X"}


async def _wait_for(path: Path) -> str:
    with anyio.fail_after(10):
        while not path.exists() or not path.read_text().strip():
            await anyio.sleep(0.02)
    return path.read_text()


async def test_hung_runsc_times_out_and_its_group_is_killed(
    make_driver: MakeDriver, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A runsc that hangs is killed with its children after the timeout."""
    pids_file = tmp_path / "hang.pids"
    monkeypatch.setenv("RUNSC_STANDIN_HANG", "create")
    monkeypatch.setenv("RUNSC_STANDIN_HANG_PIDS", str(pids_file))
    runtime = make_driver(create=1.5)
    started = time.monotonic()
    with pytest.raises(api.RunscError) as info:
        await runtime.create("a1", tmp_path, nvproxy=True)
    assert info.value.timed_out
    assert time.monotonic() - started < 5
    pids = [int(p) for p in (await _wait_for(pids_file)).split()]
    with anyio.fail_after(5):
        while not all(_gone(p) for p in pids):
            await anyio.sleep(0.05)


async def test_cancelled_runsc_is_killed_with_its_group(
    make_driver: MakeDriver, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Cancelling the caller kills a running runsc and its children too."""
    pids_file = tmp_path / "hang.pids"
    monkeypatch.setenv("RUNSC_STANDIN_HANG", "checkpoint")
    monkeypatch.setenv("RUNSC_STANDIN_HANG_PIDS", str(pids_file))
    runtime = make_driver()
    async with anyio.create_task_group() as tg:
        tg.start_soon(partial(runtime.checkpoint, "a1", tmp_path / "img", leave_running=True))
        pids = [int(p) for p in (await _wait_for(pids_file)).split()]
        tg.cancel_scope.cancel()
    with anyio.fail_after(5):
        while not all(_gone(p) for p in pids):
            await anyio.sleep(0.05)
    assert all(os.getpid() != p for p in pids)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(
            ["--root", "/r", "start", "--nvproxy", "a1"],
            "flag provided but not defined: -nvproxy",
            id="global-flag-after-subcommand",
        ),
        pytest.param(
            ["--root", "/r", "checkpoint", "--bogus", "a1"],
            "flag provided but not defined: -bogus",
            id="unknown-command-flag",
        ),
    ],
)
def test_standin_rejects_misplaced_flags_like_runsc(args: list[str], message: str) -> None:
    """The stand-in parses flags like Go's flag package: a misplaced flag is exit 2."""
    result = subprocess.run([str(STANDIN), *args], capture_output=True, text=True, check=False)
    assert (result.returncode, result.stderr.strip()) == (2, message)


@pytest.mark.parametrize(
    ("features_env", "upstream", "expected"),
    [
        pytest.param(
            None,
            True,
            {
                "create": ["--cpu-num-from-quota"],
                "start": ["--allow-connected-on-save"],
                "restore": ["--cpu-num-from-quota"],
            },
            id="worker-api-on-todays-runsc",
        ),
        pytest.param(
            "leave-running", True, {"create": [], "start": [], "restore": []}, id="older-runsc"
        ),
        pytest.param(None, False, {"create": [], "start": [], "restore": []}, id="json-door"),
    ],
)
async def test_upstreams_worker_flags_go_where_upstream_puts_them_when_runsc_has_them(
    runsc_root: Path,
    argv_log,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    features_env: str | None,
    upstream: bool,
    expected: dict[str, list[str]],
) -> None:
    """``--cpu-num-from-quota`` on create and restore, ``--allow-connected-on-save`` on start
    (upstream's runsc.go), global flags before the subcommand, each only if ``runsc flags``
    lists it, and only for an agent serving the worker API."""
    if features_env is not None:
        monkeypatch.setenv("RUNSC_STANDIN_FEATURES", features_env)
    runtime = driver.RunscDriver(
        driver.RunscConfig(root=runsc_root, runsc=str(STANDIN), upstream_worker_flags=upstream)
    ).for_actor("a.1")
    missing = tmp_path / "no-bundle"
    for call in (
        runtime.create("c", missing, nvproxy=False),
        runtime.start("c"),
        runtime.restore("c", missing, tmp_path / "image", nvproxy=False),
    ):
        with pytest.raises(api.RunscError):  # no such bundle or container: argv is logged
            await call
    found = {}
    for entry in argv_log.entries():
        for command in ("create", "start", "restore"):
            if command in entry and "help" not in entry:  # not feature detection's
                flags = entry[entry.index(str(runsc_root / "a.1")) + 1 : entry.index(command)]
                found[command] = [f for f in flags if f.startswith("--") and "=" not in f]
    assert found == expected


@pytest.mark.parametrize(
    ("features_env", "upstream", "background"),
    [
        pytest.param(None, True, True, id="worker-api-on-todays-runsc"),
        pytest.param("leave-running", True, False, id="older-runsc"),
        pytest.param(None, False, False, id="json-door"),
    ],
)
async def test_restore_loads_its_image_in_the_background_as_upstreams_worker_does(
    runsc_root: Path,
    argv_log,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    features_env: str | None,
    upstream: bool,
    background: bool,
) -> None:
    """``restore --background`` (upstream's ``restoreArgs``), a flag of the subcommand, only
    if ``runsc help restore`` lists it, and only for an agent serving the worker API."""
    if features_env is not None:
        monkeypatch.setenv("RUNSC_STANDIN_FEATURES", features_env)
    runtime = driver.RunscDriver(
        driver.RunscConfig(root=runsc_root, runsc=str(STANDIN), upstream_worker_flags=upstream)
    ).for_actor("a.1")
    with pytest.raises(api.RunscError):  # no such bundle: the argv is logged all the same
        await runtime.restore("c", tmp_path / "no-bundle", tmp_path / "image", nvproxy=False)
    [entry] = [e for e in argv_log.entries() if "restore" in e and "help" not in e]
    after = entry[entry.index("restore") + 1 :]
    assert ("--background" in after) is background
    assert after[-2:] == ["--detach", "c"]
