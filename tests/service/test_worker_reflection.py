"""gRPC reflection on the worker socket (upstream's worker registers it): a client that has
no .proto learns ``ateworker.Worker`` from the server alone and calls it, over both names of
the reflection service (v1, which grpcurl tries first, and v1alpha)."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from google.protobuf import descriptor_pool, message_factory
from grpc_reflection.v1alpha import reflection_pb2
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

from substrate_gpu.service.ateworker import ateworker_pb2 as pb

from .agentproc import AgentProcess
from .workerclient import connect


@pytest.fixture(scope="module")
def channel(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("reflection")
    sock = tmp / "worker" / "worker.sock"
    agent = AgentProcess.on_socket(tmp, "--worker-socket", str(sock), "--atelet-socket", "")
    try:
        connect(sock)
        with grpc.insecure_channel(f"unix:{sock}") as opened:
            yield opened
    finally:
        agent.terminate()


def test_list_names_the_worker_service_and_both_reflection_services(channel) -> None:
    services = set(ProtoReflectionDescriptorDatabase(channel).get_services())
    assert services == {
        "ateworker.Worker",
        "grpc.reflection.v1.ServerReflection",
        "grpc.reflection.v1alpha.ServerReflection",
    }


def test_a_client_without_the_proto_describes_and_calls_the_worker(channel) -> None:
    """Descriptors from reflection alone (a fresh pool) are our .proto's, and a message class
    built from them makes a call the server answers."""
    pool = descriptor_pool.DescriptorPool(ProtoReflectionDescriptorDatabase(channel))
    service = pool.FindServiceByName("ateworker.Worker")
    assert [m.name for m in service.methods] == [
        m.name for m in pb.DESCRIPTOR.services_by_name["Worker"].methods
    ]
    method = service.FindMethodByName("GetWorkloadStats")
    request_class = message_factory.GetMessageClass(method.input_type)
    response_class = message_factory.GetMessageClass(method.output_type)
    call = channel.unary_unary(
        "/ateworker.Worker/GetWorkloadStats",
        request_serializer=lambda m: m.SerializeToString(),
        response_deserializer=response_class.FromString,
    )
    with pytest.raises(grpc.RpcError) as answered:
        call(request_class(actor_uid="nobody"), timeout=10)
    assert answered.value.code() == grpc.StatusCode.NOT_FOUND
    assert (
        pool.FindMessageTypeByName("ateworker.ActorDirs").fields_by_name["volumes_dir"].number == 7
    )


def test_the_v1_name_answers_the_same_protocol(channel) -> None:
    """``grpc.reflection.v1.ServerReflection/ServerReflectionInfo`` (the name grpcurl asks
    first) answers a file request with the descriptor of our .proto."""
    info = channel.stream_stream(
        "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
        request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
        response_deserializer=reflection_pb2.ServerReflectionResponse.FromString,
    )
    request = reflection_pb2.ServerReflectionRequest(file_containing_symbol="ateworker.Worker")
    [response] = list(info(iter([request]), timeout=10))
    [serialized] = response.file_descriptor_response.file_descriptor_proto
    assert serialized == pb.DESCRIPTOR.serialized_pb
    assert Path(pb.DESCRIPTOR.name).name == "ateworker.proto"
