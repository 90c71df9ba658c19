"""The per-line boundary: whatever decoding a line raises is that line's answer, never more."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from substrate_gpu.service import AgentConfig, protocol, running_agent

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize(
    "raised",
    [RecursionError("deep"), MemoryError(), RuntimeError("decoder bug"), KeyError("x")],
    ids=["recursion", "memory", "runtime", "key"],
)
async def test_a_decoder_exception_is_a_malformed_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, raised: Exception
) -> None:
    """The decoder raising anything: a 'malformed' answer naming the line; the next line served."""
    config = AgentConfig(event_log=tmp_path / "events.jsonl", checkpoint_root=tmp_path / "ck")
    async with running_agent(config) as running:
        real = protocol.parse_request

        def exploding(line: bytes) -> object:
            if line.startswith(b"boom"):
                raise raised
            return real(line)

        monkeypatch.setattr(protocol, "parse_request", exploding)
        answer = json.loads(await running.service.handle_line(b"boom", 7) or b"")
        good = json.loads(
            await running.service.handle_line(
                b'{"type":"actor_registered","v":1,"actor_id":"a","gpu":false,"bundle":"/b"}', 8
            )
            or b""
        )
    assert (answer["ok"], answer["kind"], answer["line"]) == (False, "malformed", 7)
    assert type(raised).__name__ in answer["error"]
    assert good["ok"]
