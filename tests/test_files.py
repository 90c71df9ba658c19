"""``substrate_gpu._files``: a regular file is read whole and bounded, even when it turns out
longer than ``fstat`` said (it grew while being read).

procfs files are the deterministic case of a file that grows after ``fstat``: they are
regular files that ``fstat`` sizes 0, and a read returns their whole content.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from substrate_gpu import _files

#: Sized 0 by fstat, read at its full length (stable while the test runs: this process's
#: environment as it was exec'd).
GROWING = "/proc/self/environ"


def test_a_file_longer_than_fstat_said_is_read_to_its_end() -> None:
    content = Path(GROWING).read_bytes()
    assert Path(GROWING).stat().st_size == 0 < len(content)
    data, _ = _files.read_regular_file(GROWING, max_bytes=len(content), what="the file")
    assert data == content


def test_a_file_that_grows_past_its_bound_while_read_is_refused() -> None:
    """At its bound it is read; one byte over it, refused, never cut short at the bound."""
    length = len(Path(GROWING).read_bytes())
    with pytest.raises(
        _files.NotReadable, match=rf"it grew over {length - 1} bytes while being read"
    ):
        _files.read_regular_file(GROWING, max_bytes=length - 1, what="the file")


def test_a_file_over_its_bound_before_it_is_read_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "big"
    path.write_bytes(b"x" * 101)
    with pytest.raises(_files.NotReadable, match=r"it is 101 bytes, over 100"):
        _files.read_regular_file(str(path), max_bytes=100, what="the file")
