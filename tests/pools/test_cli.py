"""``substrate-gpu pool validate|render|crd``: output and exit codes."""

from __future__ import annotations

import os
from importlib import metadata
from pathlib import Path

import pytest
import yaml

from substrate_gpu.cli import EXIT_FAILED, EXIT_INVALID, EXIT_OK, main

DATA = Path(__file__).resolve().parents[1] / "data" / "pools"
VALID = sorted((DATA / "valid").glob("*.yaml"))
DEPLOY = DATA.parents[2] / "deploy"


def run(capsys: pytest.CaptureFixture[str], *argv: str | Path) -> tuple[int, str, str]:
    code = main(["pool", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def test_validate_accepts_every_valid_example(capsys: pytest.CaptureFixture[str]) -> None:
    """Valid files exit 0 and say ok for each document."""
    code, out, _ = run(capsys, "validate", *VALID)
    assert code == EXIT_OK
    assert out.count(": ok") == len(VALID)


def test_validate_reports_all_errors_of_all_files(capsys: pytest.CaptureFixture[str]) -> None:
    """Every error of every file and document is printed, with its path; exit 3."""
    code, _, err = run(
        capsys, "validate", DATA / "invalid" / "microvm-gpu.yaml", DATA / "invalid" / "several.yaml"
    )
    assert code == EXIT_INVALID
    assert (
        "microvm-gpu.yaml: error: spec.template.resources.limits: nvidia.com/gpu is only "
        "supported when sandboxClass is 'gvisor'"
    ) in err
    assert err.count("several.yaml#2: error:") == 3
    assert "several.yaml#1: error" not in err


def test_validate_warning_alone_exits_zero(capsys: pytest.CaptureFixture[str]) -> None:
    """A warning is printed but does not fail validation."""
    code, _, err = run(capsys, "validate", DATA / "warnings" / "distroless.yaml")
    assert code == EXIT_OK
    assert "warning: spec.workerImage" in err and "nvidia-ctk" in err


def test_validate_says_ateom_image_is_deprecated_and_still_exits_zero(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = run(capsys, "validate", DATA / "warnings" / "ateom-image.yaml")
    assert code == EXIT_OK
    assert "ateom-image.yaml: warning: spec.ateomImage: is deprecated" in err
    assert out.endswith("1 document(s), 0 error(s), 1 warning(s)\n")


def test_validate_bad_yaml_names_the_file_and_goes_on(capsys: pytest.CaptureFixture[str]) -> None:
    """A file that is not YAML is reported with its line, the others still checked; exit 3."""
    code, out, err = run(capsys, "validate", DATA / "invalid" / "bad-yaml.yaml", VALID[0])
    assert code == EXIT_INVALID
    assert "bad-yaml.yaml:4:" in err
    assert f"{VALID[0]}: ok" in out


def test_validate_missing_file_exits_one(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A file that cannot be read at all is an operational failure: exit 1."""
    code, _, err = run(capsys, "validate", tmp_path / "nope.yaml", VALID[0])
    assert code == EXIT_FAILED
    assert "nope.yaml" in err


def test_validate_summary_counts_the_files_not_read(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The summary after a missing file says a file was not read (not a clean "0 error(s)")."""
    code, _, err = run(capsys, "validate", tmp_path / "nope.yaml")
    assert code == EXIT_FAILED
    assert err.splitlines()[-1] == (
        "0 document(s), 0 error(s), 0 warning(s); 1 file(s) could not be read"
    )


def test_render_prints_applyable_yaml(capsys: pytest.CaptureFixture[str]) -> None:
    """render prints the worker Deployment as YAML on stdout."""
    code, out, _ = run(capsys, "render", DATA / "valid" / "gpu-pool-flat.yaml")
    assert code == EXIT_OK
    (deployment,) = yaml.safe_load_all(out)
    assert (deployment["kind"], deployment["metadata"]["name"]) == (
        "Deployment",
        "gpu-pool-flat-workers",
    )


def test_render_multi_document_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Each pool of a multi-document file renders its own Deployment."""
    both = tmp_path / "both.yaml"
    both.write_text(
        "\n---\n".join((DATA / "valid" / n).read_text() for n in ("cpu-pool.yaml", "mps-pool.yaml"))
    )
    code, out, _ = run(capsys, "render", both)
    assert code == EXIT_OK
    assert [d["metadata"]["name"] for d in yaml.safe_load_all(out)] == [
        "cpu-pool-workers",
        "mps-pool-workers",
    ]


def test_render_invalid_pool_prints_nothing_and_exits_three(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """An invalid pool is not rendered: errors on stderr, empty stdout, exit 3."""
    code, out, err = run(capsys, "render", DATA / "invalid" / "microvm-gpu.yaml")
    assert (code, out) == (EXIT_INVALID, "")
    assert "only supported when sandboxClass is 'gvisor'" in err


@pytest.mark.parametrize("flag", ["--worker-image", "--ateom-image"])
def test_render_uses_the_image_flag(
    flag: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """--worker-image (or its former name) supplies the image of a pool that names none."""
    monkeypatch.delenv("ATE_DEFAULT_WORKER_IMAGE", raising=False)
    code, out, _ = run(capsys, "render", DATA / "valid" / "user-documented.yaml", flag, "w:9")
    assert code == EXIT_OK
    assert "image: w:9" in out


def test_render_without_any_image_fails_clearly_for_a_cpu_pool(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A CPU pool without an image anywhere: exit 1, saying what to set."""
    clear_controller_env(monkeypatch)
    path = cpu_pool_without_image(tmp_path)
    code, out, err = run(capsys, "render", path)
    assert (code, out) == (EXIT_FAILED, "")
    assert "ATE_DEFAULT_WORKER_IMAGE" in err and "--worker-image IMAGE" in err


def test_render_gives_a_gpu_pool_without_an_image_this_versions_agent(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The seed's pool, from a plain shell: the built-in substrate-gpu:<version>."""
    clear_controller_env(monkeypatch)
    code, out, _ = run(capsys, "render", DATA / "valid" / "user-documented.yaml")
    assert code == EXIT_OK
    assert f"image: substrate-gpu:{metadata.version('substrate-gpu')}\n" in out


def clear_controller_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """A plain shell: none of the controller's ATE_* settings."""
    for name in [n for n in os.environ if n.startswith("ATE_")]:
        monkeypatch.delenv(name)


def cpu_pool_without_image(tmp_path: Path) -> Path:
    path = tmp_path / "cpu.yaml"
    text = (DATA / "valid" / "cpu-pool.yaml").read_text()
    path.write_text("".join(line for line in text.splitlines(True) if "workerImage" not in line))
    return path


@pytest.mark.parametrize("path", sorted((DEPLOY / "examples").glob("*.yaml")), ids=lambda p: p.name)
def test_deploy_rendered_is_pool_render_from_a_plain_shell(
    path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """deploy/rendered/X.yaml is exactly `substrate-gpu pool render deploy/examples/X.yaml`
    with no ATE_* variable and no flag: anyone can reproduce it."""
    clear_controller_env(monkeypatch)
    code, out, _ = run(capsys, "render", path)
    assert code == EXIT_OK
    assert out == (DEPLOY / "rendered" / path.name).read_text()


@pytest.mark.parametrize(
    "snippet",
    [
        pytest.param('spec:\n  resourceRequests: {nvidia.com/gpu: "1"}\n', id="spec-only"),
        pytest.param("apiVersion: x\nkind: WorkerPool\nspec: {}\n", id="no-metadata"),
        pytest.param("metadata:\nspec: {maxWorkers: 1}\n", id="empty-metadata"),
    ],
)
@pytest.mark.parametrize("command", ["validate", "render"])
def test_a_document_without_metadata_is_a_one_line_error_exit_three(
    command: str, snippet: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The docs' MPS snippet pasted alone: an error line naming metadata, exit 3, no traceback."""
    path = tmp_path / "snippet.yaml"
    path.write_text(snippet)
    code, out, err = run(capsys, command, path)
    assert code == EXIT_INVALID
    assert f"{path}: error: metadata: is required" in err
    assert "Traceback" not in err and "AttributeError" not in err
    if command == "render":
        assert out == ""


def test_validate_names_the_nearest_field_of_a_misspelt_one(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "typo.yaml"
    path.write_text(
        (DATA / "valid" / "user-documented.yaml").read_text().replace("maxWorkers", "maxWorker")
    )
    code, _, err = run(capsys, "validate", path)
    assert code == EXIT_INVALID
    assert "error: spec.maxWorker: unknown field: did you mean maxWorkers? (known: " in err


def test_validate_refuses_a_misspelt_gpu_resource(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """nvidia.com/gpus: an error with the name meant, exit 3 (not a valid CPU pool)."""
    path = tmp_path / "typo.yaml"
    path.write_text(
        (DATA / "valid" / "user-documented.yaml")
        .read_text()
        .replace("nvidia.com/gpu:", "nvidia.com/gpus:")
    )
    code, _, err = run(capsys, "validate", path)
    assert code == EXIT_INVALID
    assert (
        "error: spec.resourceRequests: nvidia.com/gpus is not nvidia.com/gpu, one edit away: "
        "did you mean nvidia.com/gpu?"
    ) in err


def test_render_forwards_the_driver_root(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The controller's ATE_NVIDIA_DRIVER_ROOT reaches GPU workers."""
    monkeypatch.setenv("ATE_NVIDIA_DRIVER_ROOT", "/drv")
    _, out, _ = run(capsys, "render", DATA / "valid" / "gpu-pool-flat.yaml")
    assert "value: /drv" in out


def test_crd_prints_the_crd(capsys: pytest.CaptureFixture[str]) -> None:
    """crd prints the CustomResourceDefinition, identical to deploy/crd.yaml."""
    code, out, _ = run(capsys, "crd")
    assert code == EXIT_OK
    assert out == (DATA.parents[2] / "deploy" / "crd.yaml").read_text()


def test_render_bad_yaml_exits_three(capsys: pytest.CaptureFixture[str]) -> None:
    """render refuses a file that is not YAML, naming its line, with nothing on stdout."""
    code, out, err = run(capsys, "render", DATA / "invalid" / "bad-yaml.yaml")
    assert (code, out) == (EXIT_INVALID, "")
    assert "bad-yaml.yaml:4:" in err


def test_render_several_files_prints_every_deployment_in_order(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """render FILE FILE …: each file's pools render, in the order given, as one stream."""
    code, out, _ = run(
        capsys, "render", DATA / "valid" / "mps-pool.yaml", DATA / "valid" / "cpu-pool.yaml"
    )
    assert code == EXIT_OK
    assert [d["metadata"]["name"] for d in yaml.safe_load_all(out)] == [
        "mps-pool-workers",
        "cpu-pool-workers",
    ]


def test_render_several_files_with_an_invalid_one_prints_nothing_and_names_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """One invalid file among several: every file is checked, the bad one named, exit 3."""
    code, out, err = run(
        capsys,
        "render",
        DATA / "valid" / "cpu-pool.yaml",
        DATA / "invalid" / "microvm-gpu.yaml",
        DATA / "invalid" / "bad-yaml.yaml",
    )
    assert (code, out) == (EXIT_INVALID, "")
    assert "microvm-gpu.yaml: error:" in err and "bad-yaml.yaml:4:" in err
    assert "cpu-pool.yaml" not in err


def test_render_several_files_with_a_missing_one_exits_one(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A file that cannot be read wins over invalid ones: exit 1, nothing on stdout."""
    code, out, err = run(
        capsys,
        "render",
        DATA / "invalid" / "microvm-gpu.yaml",
        tmp_path / "nope.yaml",
        DATA / "valid" / "cpu-pool.yaml",
    )
    assert (code, out) == (EXIT_FAILED, "")
    assert "nope.yaml" in err and "microvm-gpu.yaml: error:" in err


def test_render_several_files_names_the_pool_without_an_image(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A pool that cannot render (no image) is named with its file; nothing printed; exit 1."""
    clear_controller_env(monkeypatch)
    code, out, err = run(
        capsys, "render", DATA / "valid" / "mps-pool.yaml", cpu_pool_without_image(tmp_path)
    )
    assert (code, out) == (EXIT_FAILED, "")
    assert "cpu.yaml: error: while rendering WorkerPool" in err


def test_validate_warns_when_no_image_reaches_a_pool(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A CPU pool without workerImage, none configured: render would refuse it, so warn."""
    clear_controller_env(monkeypatch)
    code, _, err = run(capsys, "validate", cpu_pool_without_image(tmp_path))
    assert code == EXIT_OK
    assert "cpu.yaml: warning: spec.workerImage: not set" in err
    assert "ATE_DEFAULT_WORKER_IMAGE" in err and "--worker-image" in err


@pytest.mark.parametrize(
    ("configured", "env"),
    [
        pytest.param(["--worker-image", "w:9"], {}, id="flag"),
        pytest.param([], {"ATE_DEFAULT_WORKER_IMAGE": "w:1"}, id="env"),
        pytest.param([], {"ATE_DEFAULT_ATEOM_IMAGE": "w:1"}, id="env-former-name"),
    ],
)
def test_validate_does_not_warn_about_the_image_when_one_is_configured(
    configured: list[str],
    env: dict[str, str],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """A default image from the environment or --worker-image covers pools that name none."""
    clear_controller_env(monkeypatch)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    _, _, err = run(capsys, "validate", cpu_pool_without_image(tmp_path), *configured)
    assert "spec.workerImage" not in err


def test_validate_does_not_warn_about_a_gpu_pool_without_an_image(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The seed's pool has the built-in agent image: nothing to warn about."""
    clear_controller_env(monkeypatch)
    code, _, err = run(capsys, "validate", DATA / "valid" / "user-documented.yaml")
    assert (code, err) == (EXIT_OK, "")


def test_deploy_files_without_the_examples_folder_exits_one(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A missing --examples folder is named; nothing is written (not a deploy/ without pools)."""
    output = tmp_path / "deploy"
    code, _, err = run(capsys, "deploy-files", "--examples", tmp_path / "nope", "--output", output)
    assert code == EXIT_FAILED
    assert f"{tmp_path / 'nope'}" in err and "check the path" in err
    assert not output.exists()


def test_deploy_files_into_an_unwritable_place_exits_one_without_a_traceback(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """--output under a regular file: exit 1 with the path and the reason in words."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    code, _, err = run(
        capsys, "deploy-files", "--examples", DATA / "valid", "--output", blocker / "deploy"
    )
    assert code == EXIT_FAILED
    assert f"while writing {blocker / 'deploy'}" in err
    assert "[Errno" not in err and "Traceback" not in err
