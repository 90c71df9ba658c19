"""Running nvidia-ctk once per worker: flags, env, .real preference, locking, failures."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import anyio
import pytest
from support.gpu_nodes import toolkit_config

from substrate_gpu import exceptions
from substrate_gpu.injection import toolkit

pytestmark = pytest.mark.anyio


def write_script(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


@pytest.fixture
def recording_toolkit(gpu_node, tmp_path) -> tuple[Path, Path]:
    """A toolkit dir whose nvidia-ctk.real records argv and PATH, then runs the stand-in."""
    tk = tmp_path / "toolkit"
    tk.mkdir()
    calls = tmp_path / "calls.log"
    write_script(
        tk / "nvidia-ctk.real",
        f'echo "$* PATH=$PATH" >> {calls}\nexec {gpu_node.toolkit_dir}/nvidia-ctk.real "$@"\n',
    )
    write_script(tk / "nvidia-ctk", "echo 'the wrapper must not be used' >&2; exit 3\n")
    return tk, calls


def config_for(gpu_node, tmp_path, toolkit_dir: Path, **kw) -> toolkit.ToolkitConfig:
    base = toolkit_config(gpu_node, tmp_path / "cdi", **kw)
    return toolkit.ToolkitConfig(
        driver_root=base.driver_root,
        toolkit_dir=toolkit_dir,
        output_dir=base.output_dir,
        timeout=base.timeout,
        base_env=base.base_env,
    )


async def test_exact_flags_and_path(gpu_node, tmp_path, recording_toolkit):
    """nvidia-ctk.real runs with the brief's flags and <driver-root>/bin first on PATH."""
    tk, calls = recording_toolkit
    config = config_for(gpu_node, tmp_path, tk)
    await toolkit.CdiSpecGenerator(config).ensure_spec()
    args, _, path = calls.read_text().strip().partition(" PATH=")
    tmp_output = args.split("--output=")[1]
    assert args == (
        "cdi generate --format=json "
        f"--library-search-path={gpu_node.driver_root}/lib64 --output={tmp_output}"
    )
    assert Path(tmp_output).parent == config.output_dir
    assert path.split(":")[0] == f"{gpu_node.driver_root}/bin"
    assert (config.output_dir / "nvidia.json").is_file()
    assert not Path(tmp_output).exists()


async def test_plain_name_is_used_without_real(gpu_node, tmp_path):
    """Without nvidia-ctk.real, the plain nvidia-ctk runs."""
    tk = tmp_path / "tk"
    tk.mkdir()
    write_script(tk / "nvidia-ctk", f'exec {gpu_node.toolkit_dir}/nvidia-ctk.real "$@"\n')
    spec = await toolkit.CdiSpecGenerator(config_for(gpu_node, tmp_path, tk)).ensure_spec()
    assert spec.device("all") is not None


async def test_generated_once_under_concurrency(gpu_node, tmp_path, recording_toolkit):
    """Ten actors asking at once cause exactly one nvidia-ctk run, and share its spec."""
    tk, calls = recording_toolkit
    generator = toolkit.CdiSpecGenerator(config_for(gpu_node, tmp_path, tk))
    specs = []

    async def ask() -> None:
        specs.append(await generator.ensure_spec())

    async with anyio.create_task_group() as tg:
        for _ in range(10):
            tg.start_soon(ask)
    assert len(calls.read_text().splitlines()) == 1
    assert all(s is specs[0] for s in specs)


async def test_failure_is_not_memoised(gpu_node, tmp_path):
    """A failed generation is retried by the next actor, and then succeeds."""
    tk = tmp_path / "tk"
    tk.mkdir()
    flag = tmp_path / "driver-ready"
    write_script(
        tk / "nvidia-ctk.real",
        f'[ -e {flag} ] || {{ echo "failed to initialize NVML: ERROR_DRIVER_NOT_LOADED" >&2; exit 1; }}\n'
        f'exec {gpu_node.toolkit_dir}/nvidia-ctk.real "$@"\n',
    )
    generator = toolkit.CdiSpecGenerator(config_for(gpu_node, tmp_path, tk))
    with pytest.raises(exceptions.ToolkitError, match="ERROR_DRIVER_NOT_LOADED"):
        await generator.ensure_spec()
    assert generator.cached is None
    assert not (tmp_path / "cdi" / "nvidia.json").exists()
    flag.touch()
    assert (await generator.ensure_spec()).kind == "nvidia.com/gpu"


async def test_tool_stderr_is_in_the_error(tmp_path):
    """The real stand-in failing to find NVML surfaces its message."""
    from substrate_gpu.testing import node as node_

    sim = node_.build_node(tmp_path / "node", libraries=(("libcuda.so.{v}", "libcuda.so.1"),))
    generator = toolkit.CdiSpecGenerator(toolkit_config(sim, tmp_path / "cdi"))
    with pytest.raises(exceptions.ToolkitError, match="ERROR_LIBRARY_NOT_FOUND"):
        await generator.ensure_spec()


async def test_timeout_kills_the_whole_process_group(gpu_node, tmp_path):
    """A hung wrapper and its grandchild are both killed when the timeout fires."""
    tk = tmp_path / "tk"
    tk.mkdir()
    pidfile = tmp_path / "grandchild.pid"
    write_script(tk / "nvidia-ctk.real", f"sleep 300 &\necho $! > {pidfile}\nwait\n")
    config = config_for(gpu_node, tmp_path, tk)
    config = toolkit.ToolkitConfig(
        driver_root=config.driver_root, toolkit_dir=tk, output_dir=config.output_dir, timeout=1.0
    )
    started = time.monotonic()
    with pytest.raises(exceptions.ToolkitError, match="did not finish within 1s"):
        await toolkit.CdiSpecGenerator(config).ensure_spec()
    assert time.monotonic() - started < 10
    grandchild = int(pidfile.read_text())
    for _ in range(50):
        try:
            os.kill(grandchild, 0)
        except ProcessLookupError:
            break
        await anyio.sleep(0.05)
    else:
        pytest.fail(f"grandchild {grandchild} survived the timeout")


async def test_missing_glibc_interpreter_is_explained(gpu_node, tmp_path):
    """An nvidia-ctk that cannot exec for want of its ELF interpreter names the cause."""
    tk = tmp_path / "tk"
    tk.mkdir()
    source = tmp_path / "main.c"
    source.write_text("int main(void) { return 0; }\n")
    subprocess.run(
        [
            "gcc",
            "-o",
            str(tk / "nvidia-ctk"),
            "-Wl,--dynamic-linker=/lib/ld-musl-x86_64.so.1",
            str(source),
        ],
        check=True,
    )
    with pytest.raises(exceptions.ToolkitError, match="glibc-based worker runtime image"):
        await toolkit.CdiSpecGenerator(config_for(gpu_node, tmp_path, tk)).ensure_spec()


async def test_invalid_output_is_rejected_and_not_installed(gpu_node, tmp_path):
    """A spec the tool writes torn is refused; no nvidia.json appears."""
    tk = tmp_path / "tk"
    tk.mkdir()
    write_script(
        tk / "nvidia-ctk",
        'for a in "$@"; do case $a in --output=*) printf \'{"cdiVersion":"0.5.0","kind":\' > "${a#--output=}";; esac; done\n',
    )
    generator = toolkit.CdiSpecGenerator(config_for(gpu_node, tmp_path, tk))
    with pytest.raises(exceptions.CdiSpecError):
        await generator.ensure_spec()
    assert list((tmp_path / "cdi").iterdir()) == []


def test_driver_root_comes_from_the_environment():
    """ATE_NVIDIA_DRIVER_ROOT sets the driver root; the default is /usr/local/nvidia."""
    custom = toolkit.ToolkitConfig.from_env(
        {"ATE_NVIDIA_DRIVER_ROOT": "/drv"}, output_dir=Path("/o")
    )
    default = toolkit.ToolkitConfig.from_env({}, output_dir=Path("/o"))
    assert (custom.driver_root, default.driver_root) == (Path("/drv"), Path("/usr/local/nvidia"))


async def test_generation_outcomes_are_counted(gpu_node, tmp_path):
    """Each nvidia-ctk run is counted by outcome: a failure, then a success, in AgentMetrics."""
    from prometheus_client import CollectorRegistry

    from substrate_gpu.observability.metrics import AgentMetrics

    registry = CollectorRegistry()
    metrics = AgentMetrics(registry)
    tk = tmp_path / "tk"
    tk.mkdir()
    flag = tmp_path / "ready"
    write_script(
        tk / "nvidia-ctk.real",
        f'[ -e {flag} ] || {{ echo "not yet" >&2; exit 1; }}\nexec {gpu_node.toolkit_dir}/nvidia-ctk.real "$@"\n',
    )
    generator = toolkit.CdiSpecGenerator(config_for(gpu_node, tmp_path, tk), metrics=metrics)
    with pytest.raises(exceptions.ToolkitError):
        await generator.ensure_spec()
    flag.touch()
    await generator.ensure_spec()
    await generator.ensure_spec()  # cached: not a run

    def runs(outcome: str) -> float:
        value = registry.get_sample_value(
            "substrate_gpu_toolkit_generation_duration_seconds_count", {"outcome": outcome}
        )
        return value or 0.0

    assert (runs("error"), runs("ok"), runs("timeout")) == (1.0, 1.0, 0.0)
