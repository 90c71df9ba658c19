from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RegisterWorkerRequest(_message.Message):
    __slots__ = ("capacity", "hardware")
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    HARDWARE_FIELD_NUMBER: _ClassVar[int]
    capacity: WorkerResources
    hardware: HardwareIdentity
    def __init__(self, capacity: _Optional[_Union[WorkerResources, _Mapping]] = ..., hardware: _Optional[_Union[HardwareIdentity, _Mapping]] = ...) -> None: ...

class HardwareIdentity(_message.Message):
    __slots__ = ("attributes",)
    class AttributesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ATTRIBUTES_FIELD_NUMBER: _ClassVar[int]
    attributes: _containers.ScalarMap[str, str]
    def __init__(self, attributes: _Optional[_Mapping[str, str]] = ...) -> None: ...

class WorkerResources(_message.Message):
    __slots__ = ("resources", "actors")
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    ACTORS_FIELD_NUMBER: _ClassVar[int]
    resources: Resources
    actors: int
    def __init__(self, resources: _Optional[_Union[Resources, _Mapping]] = ..., actors: _Optional[int] = ...) -> None: ...

class Resources(_message.Message):
    __slots__ = ("limits",)
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    limits: _containers.RepeatedCompositeFieldContainer[Limits]
    def __init__(self, limits: _Optional[_Iterable[_Union[Limits, _Mapping]]] = ...) -> None: ...

class Limits(_message.Message):
    __slots__ = ("name", "quantity")
    NAME_FIELD_NUMBER: _ClassVar[int]
    QUANTITY_FIELD_NUMBER: _ClassVar[int]
    name: str
    quantity: str
    def __init__(self, name: _Optional[str] = ..., quantity: _Optional[str] = ...) -> None: ...

class RegisterWorkerResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RequestActorSuspendRequest(_message.Message):
    __slots__ = ("actor_atespace", "actor_name", "actor_uid")
    ACTOR_ATESPACE_FIELD_NUMBER: _ClassVar[int]
    ACTOR_NAME_FIELD_NUMBER: _ClassVar[int]
    ACTOR_UID_FIELD_NUMBER: _ClassVar[int]
    actor_atespace: str
    actor_name: str
    actor_uid: str
    def __init__(self, actor_atespace: _Optional[str] = ..., actor_name: _Optional[str] = ..., actor_uid: _Optional[str] = ...) -> None: ...

class RequestActorSuspendResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class MintActorCertificateRequest(_message.Message):
    __slots__ = ("actor_atespace", "actor_name", "actor_uid", "certificate_signing_request")
    ACTOR_ATESPACE_FIELD_NUMBER: _ClassVar[int]
    ACTOR_NAME_FIELD_NUMBER: _ClassVar[int]
    ACTOR_UID_FIELD_NUMBER: _ClassVar[int]
    CERTIFICATE_SIGNING_REQUEST_FIELD_NUMBER: _ClassVar[int]
    actor_atespace: str
    actor_name: str
    actor_uid: str
    certificate_signing_request: bytes
    def __init__(self, actor_atespace: _Optional[str] = ..., actor_name: _Optional[str] = ..., actor_uid: _Optional[str] = ..., certificate_signing_request: _Optional[bytes] = ...) -> None: ...

class MintActorCertificateResponse(_message.Message):
    __slots__ = ("actor_certificates",)
    ACTOR_CERTIFICATES_FIELD_NUMBER: _ClassVar[int]
    actor_certificates: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, actor_certificates: _Optional[_Iterable[bytes]] = ...) -> None: ...
