"""gRPC server reflection on the worker socket, as upstream's worker registers it.

Upstream's ``cmd/ateworker-gvisor/main.go`` calls ``reflection.Register(svr)`` (grpc-go), so
``grpcurl -unix …/worker.sock list`` and ``describe`` work without the .proto. grpc-go serves
the reflection service under both of its names, ``grpc.reflection.v1.ServerReflection`` and
the older ``grpc.reflection.v1alpha.ServerReflection`` (clients try v1 first, then fall back).

grpcio-reflection (the gRPC project's own implementation for Python's grpcio) ships only the
v1alpha service. The two are the same protocol: v1 was made by copying v1alpha's messages
into another package, field for field, so the bytes on the wire are identical. The one
servicer is therefore served under both names, v1 through a generic handler with v1alpha's
message classes; ``list`` names both, as grpc-go's does.
"""

from __future__ import annotations

from typing import Final

import grpc
import grpc.aio
from grpc_reflection.v1alpha import reflection, reflection_pb2, reflection_pb2_grpc

V1: Final = "grpc.reflection.v1.ServerReflection"
"""The reflection service's current name."""
V1ALPHA: Final = reflection.SERVICE_NAME
"""Its older name (``grpc.reflection.v1alpha.ServerReflection``)."""


def register(server: grpc.aio.Server, *services: str) -> None:
    """Serve reflection for ``services`` (full names, in the default descriptor pool, where
    generated stubs put their files) and for itself, under both names."""
    servicer = reflection.aio.ReflectionServicer((*services, V1, V1ALPHA))
    reflection_pb2_grpc.add_ServerReflectionServicer_to_server(servicer, server)
    v1 = grpc.stream_stream_rpc_method_handler(
        servicer.ServerReflectionInfo,
        request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
        response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString,
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(V1, {"ServerReflectionInfo": v1}),)
    )
