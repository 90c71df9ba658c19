"""The JSON codec of events and of everything built from them (log records, wire answers).

One place turns bytes into typed values and back, with msgspec: the socket protocol, the
event-log writer and reader, snapshots, replay and recovery all go through a
:class:`Decoder` and :func:`encode`. Types are msgspec ``Struct`` s (frozen, tagged on
``type``); decoding is strict (no coercion: ``"2"`` is not an int, ``true`` is not a
number), refuses unknown fields, and checks each field's constraints, in C.

A refusal is a :class:`DecodeFailure` (an :class:`EventSchemaError`) whose message names
what was wrong and where, with msgspec's path (``Expected `int`, got `str` - at `$.pid```),
and whose :attr:`~DecodeFailure.field` is that path alone. Two refusals are reworded
because msgspec's own words say too little: an unknown ``type`` lists the known ones, and
an unknown ``v`` names the versions this agent reads. Input that is not JSON, nests deeper
than the decoder's recursion limit, or is not the expected shape is *malformed*
(:attr:`~DecodeFailure.malformed`); a well-formed value that breaks a field's rule is a
schema error. Never a traceback: every failure of msgspec, including ``RecursionError``
on hostile nesting, becomes a :class:`DecodeFailure`.
"""

from __future__ import annotations

import re
import typing
from collections.abc import Mapping
from typing import Any, Final, Generic, TypeVar

import msgspec

from substrate_gpu.lifecycle import errors

T = TypeVar("T")

_ENCODER: Final = msgspec.json.Encoder()
_PATH: Final = re.compile(r" - at `(\$[^`]*)`$")
_UNKNOWN_TAG: Final = re.compile(r"^Invalid value (.+) - at `(\$[^`]*)\.type`$")
_UNKNOWN_VERSION: Final = re.compile(r"^Invalid enum value (.+) - at `(\$[^`]*)\.v`$")
_BYTE_OFFSET: Final = re.compile(r" \(byte (\d+)\)")
_NAMED_FIELD: Final = re.compile(
    r"^Object (?:missing required|contains unknown) field `([^`]+)`(?: - at `(\$[^`]*)`)?$"
)


class DecodeFailure(errors.EventSchemaError):
    """A value could not be decoded: the message says what and where (``- at `$.pid```)."""

    def __init__(self, message: str, *, field: str | None, malformed: bool) -> None:
        super().__init__(message)
        self.field = field
        """The JSON path of the offending value (``$.pid``, ``$.event.at``), when known."""
        self.malformed = malformed
        """Not JSON, nested too deeply, or not an object: nothing could be read from it."""


def encode(value: object) -> bytes:
    """The compact JSON of ``value`` (UTF-8, fields in declaration order, no newline)."""
    return _ENCODER.encode(value)


def encode_line(value: object) -> bytes:
    """``value``'s JSON and a newline: one line of the log or of the wire."""
    buffer = bytearray()
    _ENCODER.encode_into(value, buffer)
    buffer += b"\n"
    return bytes(buffer)


def to_builtins(value: object) -> Any:
    """``value`` as plain dicts, lists, strings and numbers (what :func:`encode` writes)."""
    return msgspec.to_builtins(value)


def tags_of(union: object) -> dict[str, type[msgspec.Struct]]:
    """The tagged Struct types of ``union`` (a Struct type or a Union of them), by tag."""
    members = typing.get_args(union) or (union,)
    out: dict[str, type[msgspec.Struct]] = {}
    for member in members:
        tag = member.__struct_config__.tag
        if isinstance(tag, str):
            out[tag] = member
    return out


def versions_of(cls: type[msgspec.Struct]) -> tuple[int, ...]:
    """The ``v`` values a Struct type reads (its ``v: Literal[...]`` field)."""
    hints = typing.get_type_hints(cls, include_extras=True)
    return tuple(int(v) for v in typing.get_args(hints["v"]))


class Decoder(Generic[T]):
    """Strict JSON decoding into ``type_`` (a Struct, a tagged Union, a list of them)."""

    def __init__(self, type_: Any, *, what: str, kinds: Mapping[str, type[msgspec.Struct]]) -> None:
        """``what`` names a value in messages (``event``); ``kinds``: the known tags' types."""
        self._decoder: msgspec.json.Decoder[T] = msgspec.json.Decoder(type_)
        self._type = type_
        self._what = what
        self._kinds = kinds

    def decode(self, data: bytes | str) -> T:
        """The value ``data`` holds; :class:`DecodeFailure` when it holds none."""
        try:
            return self._decoder.decode(data)
        except (msgspec.MsgspecError, RecursionError) as e:
            raise self.failure(e, data) from None

    def decode_lines(self, data: bytes | memoryview) -> list[T]:
        """One value per non-empty line of ``data`` (newline-delimited JSON)."""
        try:
            # Any buffer will do (msgspec's stub says bytes): a memoryview saves a copy.
            return self._decoder.decode_lines(typing.cast(bytes, data))
        except (msgspec.MsgspecError, RecursionError) as e:
            raise self.failure(e, None) from None

    def convert(self, data: object) -> T:
        """The value an already-parsed JSON object holds (same rules as :meth:`decode`)."""
        try:
            return msgspec.convert(data, self._type, strict=True)  # type: ignore[no-any-return]
        except (msgspec.MsgspecError, RecursionError) as e:
            raise self.failure(e, None) from None

    def failure(self, error: BaseException, data: bytes | str | None) -> DecodeFailure:
        """The :class:`DecodeFailure` for ``error`` raised while decoding ``data``."""
        if isinstance(error, RecursionError):
            return DecodeFailure(
                f"{self._what} is not valid JSON: nested too deeply", field=None, malformed=True
            )
        message = str(error)
        if not isinstance(error, msgspec.ValidationError):
            return DecodeFailure(
                f"{self._what} is not valid JSON: {_with_column(message, data)}",
                field=None,
                malformed=True,
            )
        path_match = _PATH.search(message)
        path = path_match.group(1) if path_match else None
        if isinstance(rule := error.__cause__, errors.EventFieldError):
            # Raised by an event's __post_init__: msgspec says where the event is, the
            # error which of its fields.
            path = f"{path or '$'}.{rule.field}"
            return DecodeFailure(
                f"invalid {self._what}: {rule} - at `{path}`", field=path, malformed=False
            )
        if (named := _NAMED_FIELD.match(message)) is not None:
            path = f"{named.group(2) or '$'}.{named.group(1)}"
        if (tag := _UNKNOWN_TAG.match(message)) is not None:
            known = ", ".join(sorted(self._kinds))
            message = f"unknown event type {tag.group(1)} (known: {known})"
            message += f" - at `{tag.group(2)}.type`"
        elif (version := _UNKNOWN_VERSION.match(message)) is not None:
            message = self._version_message(version.group(1), version.group(2), data)
        elif path is None and message.startswith("Expected `"):
            # The whole value has the wrong shape (an array, a string): nothing to read.
            return DecodeFailure(
                f"{self._what} must be a JSON object: {message}", field=None, malformed=True
            )
        return DecodeFailure(f"invalid {self._what}: {message}", field=path, malformed=False)

    def _version_message(self, found: str, where: str, data: bytes | str | None) -> str:
        kind = _type_at(data, where) if data is not None else None
        cls = self._kinds.get(kind) if kind is not None else None
        if cls is None:
            return f"unknown schema version {found} - at `{where}.v`"
        reads = ", ".join(str(v) for v in versions_of(cls))
        return (
            f"{kind!r} has schema version {found}; this agent reads version {reads} "
            f"(upgrade the agent to read newer logs) - at `{where}.v`"
        )


def _with_column(message: str, data: bytes | str | None) -> str:
    """msgspec's ``(byte N)`` as a line and column a person can find (1-based, characters)."""
    found = _BYTE_OFFSET.search(message)
    if found is None or data is None:
        return message
    raw = data.encode() if isinstance(data, str) else data
    before = raw[: int(found.group(1))]
    line = before.count(b"\n")
    column = len(before[before.rfind(b"\n") + 1 :].decode(errors="replace")) + 1
    where = f"at line {line + 1}, column {column}" if line else f"at column {column}"
    return f"{message[: found.start()]} {where}{message[found.end() :]}"


def _type_at(data: bytes | str, where: str) -> str | None:
    """The ``type`` of the object at ``where`` (``$``, ``$.event``) in ``data``, if any.

    Only on the error path: ``data`` already decoded far enough to reach ``v``."""
    try:
        value: object = msgspec.json.decode(data)
    except (msgspec.MsgspecError, RecursionError):
        return None
    for step in where.removeprefix("$").split(".")[1:]:
        value = value.get(step) if isinstance(value, dict) else None
    kind = value.get("type") if isinstance(value, dict) else None
    return kind if isinstance(kind, str) else None
