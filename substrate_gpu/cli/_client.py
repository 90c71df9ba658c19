"""``substrate-gpu client``: send events and queries to a running agent's socket.

So nobody needs socat or a hand-written script: ``send`` builds an event line from its
type, actor and ``key=value`` fields (``v`` filled in), ``actor``/``actors`` ask the agent
(:mod:`substrate_gpu.service.query`), and ``-`` sends JSON lines from stdin as they are.
Each answer is printed as the agent wrote it (one JSON line); a refusal is also worded on
stderr, and the exit code is 1 when any line was refused.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from substrate_gpu import exceptions
from substrate_gpu.cli._exitcodes import EXIT_FAILED, EXIT_OK

if TYPE_CHECKING:
    import socket

#: The event types a client may send, for ``--help``: the protocol's
#: ``EXTERNAL_TYPES``, written out so that building the parser loads no lifecycle
#: (tests/cli/test_client.py holds the two equal).
EXTERNAL_TYPES = (
    "actor_registered",
    "bundle_prepared",
    "cuda_context_closed",
    "cuda_context_opened",
    "delete_requested",
    "restore_requested",
    "retry_requested",
    "run_requested",
    "sandbox_exited",
    "suspend_requested",
)

#: How long to wait for one answer (an event's answer follows its fsync: milliseconds).
ANSWER_TIMEOUT_S = 60.0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``client``."""
    parser = subparsers.add_parser(
        "client",
        help="send events and queries to a running agent's socket; print its answers",
        description=(
            "Talk to a running `substrate-gpu agent --socket PATH`: send an event, ask for "
            "an actor's state, or send JSON lines from stdin. Answers are printed as JSON "
            "lines; exit 1 when the agent refused a line. See docs/agent.md."
        ),
    )
    parser.add_argument("--socket", type=Path, required=True, help="the agent's Unix socket")
    what = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    send = what.add_parser(
        "send",
        help="send one event: TYPE ACTOR_ID [FIELD=VALUE ...]",
        description="Send one external event; VALUEs are JSON when they parse (true, 7), "
        "else strings. The event's version (v) is filled in. "
        f"Event types a client may send: {', '.join(EXTERNAL_TYPES)}.",
    )
    send.add_argument("type", metavar="TYPE", help=f"one of: {', '.join(EXTERNAL_TYPES)}")
    send.add_argument("actor_id", metavar="ACTOR_ID")
    # A default makes it optional: without one, argparse 3.11 names a `*` positional among
    # "the following arguments are required".
    send.add_argument(
        "fields", nargs="*", default=[], metavar="FIELD=VALUE", help="the event's fields"
    )
    send.set_defaults(usage_error=send.error)
    actor = what.add_parser("actor", help="an actor's state and reason")
    actor.add_argument("actor_id", metavar="ACTOR_ID")
    actors = what.add_parser("actors", help="every actor (optionally: in one state)")
    actors.add_argument("--state", help="only the actors in this state")
    what.add_parser("-", help="send JSON lines from stdin (events or queries), in order")
    parser.set_defaults(handler=run, logs="never")  # see cli.main


def run(args: argparse.Namespace) -> int:
    """Handler of ``client``."""
    lines = list(_lines(args))
    refused = 0
    with _connected(args.socket) as stream:
        for number, (answer, body) in enumerate(_exchange(stream, lines, args.socket), start=1):
            sys.stdout.write(answer.decode())
            sys.stdout.flush()
            if body.get("ok") is not True:
                refused += 1
                print(
                    f"substrate-gpu client: line {number} refused ({body.get('kind')}): "
                    f"{body.get('error')}",
                    file=sys.stderr,
                )
    return EXIT_FAILED if refused else EXIT_OK


def _lines(args: argparse.Namespace) -> Iterator[bytes]:
    if args.action == "send":
        yield json.dumps(_event(args)).encode()
    elif args.action == "actor":
        yield json.dumps({"query": "actor", "actor_id": args.actor_id}).encode()
    elif args.action == "actors":
        asked = {"query": "actors"} | ({"state": args.state} if args.state else {})
        yield json.dumps(asked).encode()
    else:
        for line in sys.stdin.buffer:
            if line.strip():
                yield line.rstrip(b"\n")


def _event(args: argparse.Namespace) -> dict[str, Any]:
    """The event line ``send`` describes (a usage error for an unknown type or field form)."""
    # Imported here: queries need none of the lifecycle (an operator runs them in a loop).
    from substrate_gpu.lifecycle import codec, events  # noqa: PLC0415
    from substrate_gpu.service import protocol  # noqa: PLC0415

    cls = events.REGISTRY.get(args.type)
    if cls is None or not cls.external:
        import difflib  # noqa: PLC0415 - only on a misspelt name

        close = difflib.get_close_matches(args.type, protocol.EXTERNAL_TYPES, n=3, cutoff=0.6)
        hint = (
            f"did you mean {' or '.join(repr(c) for c in close)}?"
            if close
            else f"a client may send: {', '.join(EXTERNAL_TYPES)}"
        )
        what = "is an effect outcome, not sent by clients" if cls else "is no event type"
        args.usage_error(f"{args.type!r} {what}; {hint}")  # exits 2
        raise AssertionError("unreachable")
    body: dict[str, Any] = {
        "type": args.type,
        "v": max(codec.versions_of(cls)),
        "actor_id": args.actor_id,
    }
    for field in args.fields:
        name, sep, raw = field.partition("=")
        if not sep or not name:
            args.usage_error(f"{field!r} is not FIELD=VALUE")
        try:
            body[name] = json.loads(raw)
        except json.JSONDecodeError:
            body[name] = raw
    return body


@contextlib.contextmanager
def _connected(path: Path) -> Iterator[socket.socket]:
    import socket  # noqa: PLC0415  (only `client` connects: kept out of the others' start)

    stream = socket.socket(socket.AF_UNIX)
    stream.settimeout(ANSWER_TIMEOUT_S)
    try:
        stream.connect(str(path))
    except OSError as e:
        stream.close()
        raise exceptions.SubstrateGpuError(
            f"while connecting to the agent socket {path}: {(e.strerror or str(e)).lower()}; "
            f"is the agent running with --socket {path}?"
        ) from None
    with stream:
        yield stream


def _exchange(
    stream: socket.socket, lines: Iterable[bytes], path: Path
) -> Iterator[tuple[bytes, dict[str, Any]]]:
    """Send each line and read its answer (one at a time: answers come in order): the line
    as it came, and parsed."""
    reader = stream.makefile("rb")
    for line in lines:
        try:
            stream.sendall(line + b"\n")
            answer = reader.readline()
        except OSError as e:
            raise exceptions.SubstrateGpuError(
                f"while talking to the agent on {path}: {(e.strerror or str(e)).lower()}"
            ) from None
        if not answer:
            raise exceptions.SubstrateGpuError(
                f"while talking to the agent on {path}: it closed the connection "
                "before answering (is it shutting down?)"
            )
        yield answer, _parsed_answer(answer, path)


#: What the other end says first when it is a gRPC server, as every HTTP/2 server does (RFC
#: 9113 §3.4: the server's connection preface is a SETTINGS frame): a 9-byte frame header of
#: type 0x4 on stream 0. The agent's JSON socket never speaks first, nor in binary.
_HTTP2_SETTINGS_TYPE = 0x04


def _is_http2_preface(answer: bytes) -> bool:
    """Whether ``answer`` starts with an HTTP/2 SETTINGS frame header (the server preface)."""
    if len(answer) < 9:
        return False
    length = int.from_bytes(answer[:3], "big")
    stream = int.from_bytes(answer[5:9], "big") & 0x7FFF_FFFF
    return answer[3] == _HTTP2_SETTINGS_TYPE and stream == 0 and length % 6 == 0


def _parsed_answer(answer: bytes, path: Path) -> dict[str, Any]:
    """The agent's answer, parsed. One that is no JSON line is refused in words: the gRPC
    worker API socket (the likeliest mistake: the agent serves both) is named, with how to
    talk to it."""
    if _is_http2_preface(answer):
        raise exceptions.SubstrateGpuError(
            f"while talking to the agent on {path}: this socket speaks HTTP/2 (gRPC): it is "
            "the worker API socket (`agent --worker-socket`), service ateworker.Worker, not "
            "the agent's JSON-lines socket (`agent --socket`) this command talks to. Call the "
            f"worker API with grpcurl (`grpcurl -plaintext -unix {path} list`) or the Python "
            'stubs in substrate_gpu.service.ateworker; see docs/worker-api.md, "Clients"'
        )
    try:
        body: dict[str, Any] = json.loads(answer)
    except ValueError:  # not UTF-8 (UnicodeDecodeError) or not JSON
        shown = answer[:32]
        raise exceptions.SubstrateGpuError(
            f"while talking to the agent on {path}: the answer is not a JSON line (it starts "
            f"{shown!r}); is {path} the socket of `substrate-gpu agent --socket`?"
        ) from None
    return body
