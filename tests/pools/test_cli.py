"""``substrate-gpu pool validate|render|crd``: output and exit codes."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from substrate_gpu.cli import EXIT_FAILED, EXIT_INVALID, EXIT_OK, main

DATA = Path(__file__).resolve().parents[1] / "data" / "pools"
VALID = sorted((DATA / "valid").glob("*.yaml"))


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
    assert "warning: spec.ateomImage" in err and "nvidia-ctk" in err


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


def test_render_uses_the_image_flag(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """--ateom-image supplies the worker image for a pool that names none."""
    monkeypatch.delenv("ATE_DEFAULT_ATEOM_IMAGE", raising=False)
    code, out, _ = run(
        capsys, "render", DATA / "valid" / "user-documented.yaml", "--ateom-image", "ateom:9"
    )
    assert code == EXIT_OK
    assert "image: ateom:9" in out


def test_render_without_any_image_fails_clearly(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without an image anywhere, render exits 1 and says what to set."""
    monkeypatch.delenv("ATE_DEFAULT_ATEOM_IMAGE", raising=False)
    code, out, err = run(capsys, "render", DATA / "valid" / "user-documented.yaml")
    assert (code, out) == (EXIT_FAILED, "")
    assert "ATE_DEFAULT_ATEOM_IMAGE" in err and "--ateom-image IMAGE" in err


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
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pool that cannot render (no image) is named with its file; nothing printed; exit 1."""
    monkeypatch.delenv("ATE_DEFAULT_ATEOM_IMAGE", raising=False)
    code, out, err = run(
        capsys, "render", DATA / "valid" / "cpu-pool.yaml", DATA / "valid" / "user-documented.yaml"
    )
    assert (code, out) == (EXIT_FAILED, "")
    assert "user-documented.yaml: error: while rendering WorkerPool" in err


def test_validate_warns_when_a_pool_has_no_image_and_none_is_configured(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """No spec.ateomImage and no ATE_DEFAULT_ATEOM_IMAGE: render would refuse it, so warn."""
    monkeypatch.delenv("ATE_DEFAULT_ATEOM_IMAGE", raising=False)
    code, _, err = run(capsys, "validate", DATA / "valid" / "user-documented.yaml")
    assert code == EXIT_OK
    assert "user-documented.yaml: warning: spec.ateomImage: not set" in err
    assert "ATE_DEFAULT_ATEOM_IMAGE" in err and "--ateom-image" in err


@pytest.mark.parametrize(
    "configured",
    [pytest.param(["--ateom-image", "ateom:9"], id="flag"), pytest.param([], id="env")],
)
def test_validate_does_not_warn_about_the_image_when_one_is_configured(
    configured: list[str],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A default image from the environment or --ateom-image covers pools that name none."""
    monkeypatch.setenv("ATE_DEFAULT_ATEOM_IMAGE", "ateom:1")
    if configured:
        monkeypatch.delenv("ATE_DEFAULT_ATEOM_IMAGE")
    _, _, err = run(capsys, "validate", DATA / "valid" / "user-documented.yaml", *configured)
    assert "spec.ateomImage" not in err


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
