"""A .proto's descriptor as rows: what docs/worker-api.md's field tables must list (the worker
API's by default; atelet's support service's too)."""

from __future__ import annotations

from google.protobuf import descriptor

from substrate_gpu.service.ateworker import ateworker_pb2

_SCALARS = {
    value: name.removeprefix("TYPE_").lower()
    for name, value in vars(descriptor.FieldDescriptor).items()
    if name.startswith("TYPE_")
}


def field_type(field: descriptor.FieldDescriptor) -> str:
    """The field's type as a .proto file spells it (``repeated X``, ``optional X``, maps)."""
    message = field.message_type
    if message is not None and message.GetOptions().map_entry:
        key, value = message.fields
        return f"map<{field_type(key)}, {field_type(value)}>"
    if message is not None:
        base = message.name
    elif field.enum_type is not None:
        base = field.enum_type.name
    else:
        base = _SCALARS[field.type]
    if field.is_repeated:
        return f"repeated {base}"
    if field.containing_oneof is not None:  # proto3 `optional`: a synthetic one-field oneof
        return f"optional {base}"
    return base


def field_rows(
    file: descriptor.FileDescriptor = ateworker_pb2.DESCRIPTOR,
) -> list[tuple[str, str, str, str]]:
    """``(message, field, number, type)`` for every field of every top-level message."""
    return [
        (message.name, field.name, str(field.number), field_type(field))
        for message in file.message_types_by_name.values()
        for field in message.fields
    ]


def enum_rows(
    file: descriptor.FileDescriptor = ateworker_pb2.DESCRIPTOR,
) -> list[tuple[str, str, str]]:
    """``(enum, value, number)`` for every enum value."""
    return [
        (enum.name, value.name, str(value.number))
        for enum in file.enum_types_by_name.values()
        for value in enum.values
    ]


def method_rows(
    file: descriptor.FileDescriptor = ateworker_pb2.DESCRIPTOR, service_name: str = "Worker"
) -> list[tuple[str, str, str]]:
    """``(method, request, response)`` for every method of the service (``ateworker.Worker``)."""
    service = file.services_by_name[service_name]
    return [(m.name, m.input_type.name, m.output_type.name) for m in service.methods]
