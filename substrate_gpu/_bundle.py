"""Every read and write of a file under an OCI bundle directory, confined to that directory.

A bundle directory (an actor's ``bundle``, a worker request's ``actor_dirs.oci_bundle_dir``)
holds one OCI bundle, or one per container of a sandbox (``<dir>/_pause``, ``<dir>/<app>``).
Another component prepares it, and what it holds is not trusted to be what it should be:

- a **symlink** anywhere under it (``_pause`` -> a directory elsewhere, ``config.json`` ->
  a host file) would send our reads and, worse, our rewrites of config.json outside it. The
  bundle directory itself is opened as given (the caller named it); below it every
  component is walked from its parent's descriptor with ``O_NOFOLLOW``
  (:func:`substrate_gpu._files.open_directory`), so a link is refused, never followed;
- a **FIFO** (or a device) in place of config.json would block a plain ``open`` for ever,
  and with it the agent's event loop; the file is opened ``O_NONBLOCK`` and must be a
  regular file of at most :data:`MAX_CONFIG_BYTES`;
- a rewrite (CRI annotations, the sandbox's size, the GPU edits) is atomic (temp file,
  fsync, rename, fsync of the directory) and happens in the very directory the read came
  from: :func:`open_container` holds its descriptor for both.

The functions here block (they do file I/O); callers on the event loop run them in a thread
(:func:`substrate_gpu._blocking.run_abandonable`). Every failure is a
:class:`BundleFileError` whose message names the file and what is wrong with it; callers
say what they were doing ("while injecting GPUs into bundle ...: ").
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from substrate_gpu import _atomic, _files

__all__ = [
    "CONFIG",
    "MAX_CONFIG_BYTES",
    "BundleFileError",
    "ContainerBundle",
    "decode_config",
    "encode_config",
    "open_container",
    "read_config",
]

CONFIG: Final = "config.json"
#: The largest config.json read (a real one is a few KiB; runc's own are under 100 KiB).
MAX_CONFIG_BYTES: Final = 16 << 20


class BundleFileError(Exception):
    """A file (or a directory on its path) under a bundle directory is not usable; the
    message names it and says why. ``missing``: it is not there at all."""

    def __init__(self, message: str, *, missing: bool = False) -> None:
        super().__init__(message)
        self.missing = missing


def _no_constant(name: str) -> object:
    raise ValueError(f"{name} is not JSON")


def _finite(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError(f"the number {text} is out of range")
    return value


def encode_config(config: Mapping[str, object]) -> bytes:
    """config.json bytes as we write them: compact UTF-8, like containerd and runc write them.

    The standard library's ``json``: what msgspec saved per warm injection is nothing a user
    sees next to the ``runsc create`` that follows, and importing it slowed every
    ``substrate-gpu inject`` (tests/bench/README.md, "Figures behind design choices").
    """
    return _encode(config)


def _encode(value: object) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


def decode_config(raw: bytes, path: str) -> dict[str, object]:
    """The JSON object in ``raw`` (the bytes of ``path``), read as runc reads it: UTF-8,
    strict JSON (no NaN or Infinity, no number beyond a double), and writable back."""
    try:
        config = json.loads(raw.decode("utf-8"), parse_constant=_no_constant, parse_float=_finite)
        # A lone surrogate escape (\ud800) decodes but could never be written back.
        _encode(config)
    except UnicodeDecodeError as e:
        raise BundleFileError(f"{path} is not valid JSON: it is not UTF-8 ({e})") from e
    except (ValueError, UnicodeError) as e:
        raise BundleFileError(f"{path} is not valid JSON: {e}") from e
    except RecursionError as e:  # json's answer to thousands of nested [ or {
        raise BundleFileError(
            f"{path} is not a usable OCI config: its JSON is nested too deeply"
        ) from e
    if not isinstance(config, dict):
        raise BundleFileError(f"{path} is not a JSON object")
    return config


@dataclass(frozen=True)
class ContainerBundle:
    """One container's bundle directory, open (see :func:`open_container`)."""

    path: str
    """The directory, as a string (``<bundle dir>`` or ``<bundle dir>/<container>``)."""
    fd: int
    """Its ``O_PATH`` descriptor: every read and write here is relative to it."""

    @property
    def config_path(self) -> str:
        """``<path>/config.json``, for messages."""
        return f"{self.path}/{CONFIG}"

    def read_config(self) -> tuple[dict[str, object], int]:
        """The parsed config.json and its permission bits (kept when it is rewritten)."""
        path = self.config_path
        try:
            raw, mode = _files.read_regular_at(
                self.fd, CONFIG, max_bytes=MAX_CONFIG_BYTES, what="a bundle's config.json"
            )
        except _files.NotReadable as e:
            raise BundleFileError(f"refusing {path}: {e}") from e
        except FileNotFoundError as e:
            raise BundleFileError(f"cannot read {path}: {e.strerror or e}", missing=True) from e
        except OSError as e:
            raise BundleFileError(f"cannot read {path}: {e.strerror or e}") from e
        return decode_config(raw, path), mode

    def write_config(self, config: Mapping[str, object], mode: int) -> None:
        """Replace config.json with ``config`` atomically, with permission bits ``mode``;
        on a failure the previous file is intact."""
        try:
            _atomic.write_atomically_at(self.fd, CONFIG, encode_config(config), mode=mode)
        except OSError as e:
            raise BundleFileError(
                f"cannot write {self.config_path}: {e.strerror or e}; the previous "
                "config.json is intact"
            ) from e


@contextlib.contextmanager
def open_container(
    bundle_dir: Path | str, container: str | None = None
) -> Iterator[ContainerBundle]:
    """The bundle of ``container`` in ``bundle_dir`` (``None``: ``bundle_dir`` is the
    bundle), its directory reached through real directories only; closed on leaving.

    ``bundle_dir`` is opened as given; ``container`` must be a real directory in it, never a
    symlink (:class:`BundleFileError` naming it otherwise, or when either is missing).
    """
    root = str(bundle_dir)
    path = root if container is None else f"{root}/{container}"
    names = () if container is None else (container,)
    try:
        fd = _files.open_directory(root, names)
    except _files.NotReadable as e:
        raise BundleFileError(
            f"refusing {path}/{CONFIG}: {e}; every directory under the bundle directory "
            f"{root} must be a real directory, never a link"
        ) from e
    except FileNotFoundError as e:
        raise BundleFileError(
            f"cannot read {path}/{CONFIG}: {e.strerror or e}", missing=True
        ) from e
    except OSError as e:
        raise BundleFileError(f"cannot read {path}/{CONFIG}: {e.strerror or e}") from e
    try:
        yield ContainerBundle(path=path, fd=fd)
    finally:
        os.close(fd)


def read_config(
    bundle_dir: Path | str, container: str | None = None
) -> tuple[dict[str, object], int]:
    """:meth:`ContainerBundle.read_config` of :func:`open_container`."""
    with open_container(bundle_dir, container) as bundle:
        return bundle.read_config()
