"""Fully qualified CDI device names: ``vendor/class=name``.

A port of the reference library's ``parser.ParseQualifiedName`` rules
(``nvidia.com/gpu=0``, ``nvidia.com/gpu=GPU-<uuid>``, ``k8s.gpu.nvidia.com/claim=<uid>-gpu-0``):
the kind is the part before ``=``, split at its first ``/`` into vendor and class; vendor
and class follow the kind rules the spec parser checks, the device name the device-name rule.
Pure: text in, value or :class:`~substrate_gpu.exceptions.DeviceRequestError` out.
"""

from __future__ import annotations

from dataclasses import dataclass

from substrate_gpu import exceptions
from substrate_gpu.cdi import parse


@dataclass(frozen=True, order=True)
class QualifiedName:
    """One device of one kind, as a container runtime or a DRA claim names it."""

    vendor: str
    """``nvidia.com``."""
    class_: str
    """``gpu``."""
    name: str
    """The device name within the spec (``0``, ``GPU-…``, ``all``)."""

    @property
    def kind(self) -> str:
        """``vendor/class``: the ``kind`` of the spec that defines the device."""
        return f"{self.vendor}/{self.class_}"

    def __str__(self) -> str:
        return f"{self.kind}={self.name}"


def qualified_name(kind: str, name: str) -> QualifiedName:
    """The qualified name of device ``name`` in a spec of ``kind`` (both already validated)."""
    vendor, _, class_ = kind.partition("/")
    return QualifiedName(vendor, class_, name)


def parse_qualified_name(text: str) -> QualifiedName:
    """``vendor/class=name`` as a :class:`QualifiedName`; a clear error for anything else."""

    def refuse(problem: str) -> exceptions.DeviceRequestError:
        return exceptions.DeviceRequestError(
            f"while resolving CDI device {text!r}: {problem}; expected a fully qualified"
            " name such as nvidia.com/gpu=0"
        )

    kind, equals, name = text.partition("=")
    if not equals:
        raise refuse("no '=' between the kind and the device name")
    vendor, slash, class_ = kind.partition("/")
    if not slash:
        raise refuse(f"the kind {kind!r} has no vendor/class '/'")
    for part, what in ((vendor, "vendor"), (class_, "class")):
        if not parse.VENDOR_OR_CLASS.fullmatch(part):
            raise refuse(
                f"invalid {what} {part!r} (letters, digits, '_', '-', '.';"
                " starting with a letter, ending with a letter or digit)"
            )
    if not parse.DEVICE_NAME.fullmatch(name):
        raise refuse(
            f"invalid device name {name!r} (letters, digits, '_', '-', '.', ':';"
            " starting and ending with a letter or digit)"
        )
    return QualifiedName(vendor, class_, name)
