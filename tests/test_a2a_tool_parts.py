"""``A2AAgent`` (the A2A tool) reading an answer that is not text: a remote agent that
answered with a ``data`` part or a file alone gave the model an empty result. Now the
model reads the data's JSON text (integers past 64 bits exact) and a line naming each
file. The parts are built with the ``a2a-sdk``'s own protobuf types and written as its
servers write them (``json_format``), except the big integer, which a protobuf ``Value``
cannot carry (a double): that event is raw JSON, as a server of another SDK writes it."""

from __future__ import annotations

from typing import Any

from a2a.types import a2a_pb2 as pb
from google.protobuf import json_format

from actors.a2a import A2AAgent, wire
from runtime import Host, ToolMessage
from runtime.json_exact import dumps as exact_dumps
from tests.test_a2a_attacks import TOKEN, WORKING, event, hostile, lead, stream

BIG = 123456789012345678901234567890
"""Past 64 bits: orjson reads it as 1.2345678901234568e+29."""


def sdk(response: pb.StreamResponse) -> dict[str, Any]:
    """A ``StreamResponse`` as the ``a2a-sdk`` writes it on the wire."""
    return json_format.MessageToDict(response)


def data_part(value: dict[str, Any]) -> pb.Part:
    part = pb.Part()
    part.data.struct_value.update(value)
    return part


def answer(*parts: pb.Part) -> dict[str, Any]:
    message = pb.Message(message_id="m1", role=pb.Role.ROLE_AGENT, parts=list(parts))
    return sdk(pb.StreamResponse(message=message))


DONE = {"statusUpdate": {"status": {"state": wire.COMPLETED}}}


async def test_a_data_part_alone_is_the_json_text_the_model_reads():
    async with hostile() as remote:
        remote.answer = lambda body: stream(event(answer(data_part({"city": "Oslo"}))))
        tool = A2AAgent(remote.url, token=TOKEN).as_tool(name="remote")
        async with Host.open(log_tap=False) as host:
            session = await host.open_session(lead(tool), session_id="p")
            result = await session.run("go")
    message = next(m for m in session.messages if isinstance(m, ToolMessage))
    assert message.output == '{"city":"Oslo"}'
    assert result.text == 'Got: {"city":"Oslo"}'


async def test_files_are_named_with_their_url_or_size_on_lines_of_their_own():
    linked = pb.Part(
        url="https://files.example/r.pdf", filename="r.pdf", media_type="application/pdf"
    )
    inline = pb.Part(raw=b"abcde", filename="x.bin")
    update = pb.TaskArtifactUpdateEvent(
        task_id="t1",
        context_id="c",
        append=True,
        artifact=pb.Artifact(artifact_id="a", parts=[linked]),
    )
    more = pb.TaskArtifactUpdateEvent(
        task_id="t1",
        context_id="c",
        append=True,
        artifact=pb.Artifact(artifact_id="a", parts=[inline, pb.Part(text="done")]),
    )
    async with hostile() as remote:
        remote.answer = lambda body: stream(
            event(WORKING),
            event({"artifactUpdate": {"artifact": {"parts": [{"text": "Here:"}]}}}),
            event(sdk(pb.StreamResponse(artifact_update=update))),
            event(sdk(pb.StreamResponse(artifact_update=more))),
            event(DONE),
        )
        text = await A2AAgent(remote.url, token=TOKEN).run("hi")
    assert text == (
        "Here:\n[file r.pdf (application/pdf): https://files.example/r.pdf]"
        "\n[file x.bin, 5 bytes, not shown]\ndone"
    )


async def test_an_integer_past_64_bits_in_a_streamed_data_part_is_exact():
    raw = (
        b"data: "
        + exact_dumps(
            wire.jsonrpc_result(
                "1", {"message": {"messageId": "m", "parts": [{"data": {"n": BIG}}]}}
            ),
            marked=False,
        )
        + b"\n\n"
    )
    async with hostile() as remote:
        remote.answer = lambda body: stream(raw)
        text = await A2AAgent(remote.url, token=TOKEN).run("hi")
    assert text == f'{{"n":{BIG}}}'


async def test_an_integer_past_64_bits_in_a_whole_answer_is_exact():
    from starlette.responses import Response

    body = {"message": {"messageId": "m", "parts": [{"data": {"n": BIG}}]}}
    async with hostile() as remote:
        remote.card["capabilities"]["streaming"] = False
        remote.answer = lambda request: Response(
            exact_dumps(wire.jsonrpc_result(request["id"], body), marked=False)
        )
        text = await A2AAgent(remote.url, token=TOKEN).run("hi")
    assert text == f'{{"n":{BIG}}}'


async def test_a_file_urls_user_info_is_not_what_the_model_reads():
    linked = pb.Part(url="https://reader:pw-of-files-7@files.example/r.pdf", filename="r.pdf")
    async with hostile() as remote:
        remote.answer = lambda body: stream(event(answer(linked)))
        text = await A2AAgent(remote.url, token=TOKEN).run("hi")
    assert text == "[file r.pdf: https://[redacted]@files.example/r.pdf]"


async def test_text_in_a_later_event_starts_a_line_after_a_data_part():
    first = {"artifactUpdate": {"append": True, "artifact": {"parts": [{"text": "Got:"}]}}}
    data = {"artifactUpdate": {"append": True, "artifact": {"parts": [{"data": {"n": 1}}]}}}
    more = {"artifactUpdate": {"append": True, "artifact": {"parts": [{"text": "done"}]}}}
    async with hostile() as remote:
        remote.answer = lambda body: stream(
            event(WORKING), event(first), event(data), event(more), event(DONE)
        )
        text = await A2AAgent(remote.url, token=TOKEN).run("hi")
    assert text == 'Got:\n{"n":1}\ndone'


async def test_a_tasks_second_artifact_starts_a_line_after_the_firsts_data_part():
    task = {
        "task": {
            "id": "t1",
            "status": {"state": wire.COMPLETED},
            "artifacts": [
                {"artifactId": "a", "parts": [{"data": {"n": 1}}]},
                {"artifactId": "b", "parts": [{"text": "done"}]},
            ],
        }
    }
    async with hostile() as remote:
        remote.answer = lambda body: stream(event(task))
        text = await A2AAgent(remote.url, token=TOKEN).run("hi")
    assert text == '{"n":1}\ndone'


async def test_an_empty_text_part_between_a_data_part_and_text_keeps_the_line():
    parts = [{"data": {"n": 1}}, {"text": ""}, {"text": "done"}]
    async with hostile() as remote:
        remote.answer = lambda body: stream(event({"message": {"messageId": "m", "parts": parts}}))
        text = await A2AAgent(remote.url, token=TOKEN).run("hi")
    assert text == '{"n":1}\ndone'
