"""``substrate_gpu._bundle``: every file under a bundle directory is read and written confined
to it: no symlink followed anywhere below it, never a blocking open, bounded, atomic."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from substrate_gpu import _bundle

CONFIG = {"ociVersion": "1.0.2", "process": {"args": ["sleep", "1"]}}


@pytest.fixture
def bundle_dir(tmp_path: Path) -> Path:
    """A sandbox's bundle directory: ``_pause/config.json``."""
    top = tmp_path / "bundles"
    (top / "_pause").mkdir(parents=True)
    (top / "_pause" / "config.json").write_text(json.dumps(CONFIG))
    return top


def _within_10s(call: Callable[[], object]) -> BaseException | None:
    """Run ``call`` in a thread; the error it raised (None: it returned). Fails the test
    instead of hanging it when the call blocks."""
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            call()
            outcome.append(None)
        except BaseException as e:  # handed to the test
            outcome.append(e)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(10)
    assert outcome, "the call blocked for 10 s"
    return outcome[0]


def test_a_containers_config_is_read_with_its_mode(bundle_dir: Path) -> None:
    (bundle_dir / "_pause" / "config.json").chmod(0o640)
    assert _bundle.read_config(bundle_dir, "_pause") == (CONFIG, 0o640)


def test_a_bundle_given_as_the_directory_itself_is_read(bundle_dir: Path) -> None:
    """No container: the directory is the bundle (a single-container actor)."""
    assert _bundle.read_config(bundle_dir / "_pause")[0] == CONFIG


def test_a_fifo_config_is_refused_at_once_naming_it(bundle_dir: Path) -> None:
    """A FIFO nobody writes: a plain open would wait for ever; this one refuses at once."""
    (bundle_dir / "_pause" / "config.json").unlink()
    os.mkfifo(bundle_dir / "_pause" / "config.json")
    error = _within_10s(lambda: _bundle.read_config(bundle_dir, "_pause"))
    assert isinstance(error, _bundle.BundleFileError)
    assert str(error) == (
        f"refusing {bundle_dir}/_pause/config.json: it is not a regular file (a FIFO); "
        "a bundle's config.json must be a file"
    )


def test_a_fifo_in_place_of_a_container_directory_is_refused_at_once(bundle_dir: Path) -> None:
    os.mkfifo(bundle_dir / "app")
    error = _within_10s(lambda: _bundle.read_config(bundle_dir, "app"))
    assert isinstance(error, _bundle.BundleFileError)
    assert "'app' on its path is not a directory (a FIFO)" in str(error)


@pytest.mark.parametrize(
    "target",
    [
        pytest.param("elsewhere", id="a-directory-outside"),
        pytest.param("bundles/_pause", id="a-sibling-inside"),
    ],
)
def test_a_symlinked_container_directory_is_refused_and_nothing_written_through_it(
    bundle_dir: Path, tmp_path: Path, target: str
) -> None:
    """Wherever the link points, even inside the bundle directory: never followed."""
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "config.json").write_text(json.dumps(CONFIG))
    (bundle_dir / "app").symlink_to(tmp_path / target)
    before = (tmp_path / target / "config.json").read_bytes()
    with pytest.raises(_bundle.BundleFileError) as caught:
        with _bundle.open_container(bundle_dir, "app") as bundle:
            bundle.write_config({"hijacked": True}, 0o644)
    assert str(caught.value) == (
        f"refusing {bundle_dir}/app/config.json: 'app' on its path is a symbolic link; every "
        f"directory under the bundle directory {bundle_dir} must be a real directory, never a link"
    )
    assert (tmp_path / target / "config.json").read_bytes() == before


def test_a_symlinked_config_is_refused(bundle_dir: Path, tmp_path: Path) -> None:
    host = tmp_path / "host.json"
    host.write_text("{}")
    (bundle_dir / "_pause" / "config.json").unlink()
    (bundle_dir / "_pause" / "config.json").symlink_to(host)
    with pytest.raises(_bundle.BundleFileError, match="it is a symbolic link"):
        _bundle.read_config(bundle_dir, "_pause")


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        pytest.param(b"\xff{}", "is not valid JSON: it is not UTF-8", id="not-utf8"),
        pytest.param(b"{", "is not valid JSON", id="not-json"),
        pytest.param(b'{"a": NaN}', "is not valid JSON: NaN is not JSON", id="nan"),
        pytest.param(b"[]", "is not a JSON object", id="array"),
        pytest.param(b"[" * 100_000, "nested too deeply", id="nested"),
    ],
)
def test_an_unusable_config_is_refused_naming_the_file(
    bundle_dir: Path, content: bytes, problem: str
) -> None:
    (bundle_dir / "_pause" / "config.json").write_bytes(content)
    with pytest.raises(_bundle.BundleFileError, match=problem) as caught:
        _bundle.read_config(bundle_dir, "_pause")
    assert f"{bundle_dir}/_pause/config.json" in str(caught.value)


def test_a_config_over_the_limit_is_refused_before_it_is_read(bundle_dir: Path) -> None:
    with (bundle_dir / "_pause" / "config.json").open("wb") as f:
        f.truncate(_bundle.MAX_CONFIG_BYTES + 1)  # sparse: no disk written
    with pytest.raises(_bundle.BundleFileError, match="bytes, over 16777216"):
        _bundle.read_config(bundle_dir, "_pause")


@pytest.mark.parametrize("container", ["missing", "_pause/missing"])
def test_a_missing_bundle_is_reported_as_missing(bundle_dir: Path, container: str) -> None:
    (bundle_dir / "_pause" / "config.json").unlink()
    name = "missing" if container == "missing" else "_pause"
    with pytest.raises(_bundle.BundleFileError, match="No such file or directory") as caught:
        _bundle.read_config(bundle_dir, name)
    assert caught.value.missing


def test_a_container_name_that_is_no_plain_name_is_refused(bundle_dir: Path) -> None:
    """``..`` would climb out of the bundle directory."""
    with pytest.raises(_bundle.BundleFileError, match="not a plain directory name"):
        _bundle.read_config(bundle_dir / "_pause", "..")


def test_a_rewrite_keeps_the_mode_and_leaves_no_temporary_file(bundle_dir: Path) -> None:
    config_path = bundle_dir / "_pause" / "config.json"
    config_path.chmod(0o640)
    with _bundle.open_container(bundle_dir, "_pause") as bundle:
        config, mode = bundle.read_config()
        bundle.write_config({**config, "hostname": "h"}, mode)
    assert json.loads(config_path.read_text()) == {**CONFIG, "hostname": "h"}
    assert config_path.stat().st_mode & 0o777 == 0o640
    assert [p.name for p in config_path.parent.iterdir()] == ["config.json"]


def test_a_rewrite_lands_where_the_config_was_read_even_if_a_link_replaced_it_since(
    bundle_dir: Path, tmp_path: Path
) -> None:
    """The directory is held by its descriptor: swapping ``_pause`` for a link between the
    read and the write cannot send the write elsewhere."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "config.json").write_text("{}")
    with _bundle.open_container(bundle_dir, "_pause") as bundle:
        config, mode = bundle.read_config()
        (bundle_dir / "_pause").rename(bundle_dir / "_pause.moved")
        (bundle_dir / "_pause").symlink_to(elsewhere)
        bundle.write_config({**config, "hostname": "h"}, mode)
    assert (elsewhere / "config.json").read_text() == "{}"
    assert json.loads((bundle_dir / "_pause.moved" / "config.json").read_text())["hostname"] == "h"
