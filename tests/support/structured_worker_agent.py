"""The worker tests' agent with a structured answer
(``--agent tests.support.structured_worker_agent:agent``): ``output_type`` :class:`Answer`,
``output_retries=2``. Its scripted answers depend on the request only:

* input ``json ...``: one step answering a valid :class:`Answer` whose words carry
  ``AXON_TEST_ANSWER_TAG`` (so the worker that takes a turn over answers otherwise);
* input ``wrong ...``: steps 0 and 1 answer JSON that does not validate; step 2 a valid
  answer whose ``total`` is how many retry prompts (the validation errors the model is
  shown) its request held;
* input ``never ...``: every step answers JSON that does not validate;
* input ``approve ...``: step 0 answers JSON that does not validate, step 1 calls
  ``guarded``, which needs a person's approval (the turn waits), step 2 answers as
  ``wrong`` turns do.

``AXON_TEST_HOLD_STEP`` and ``AXON_TEST_HOLD`` (seconds): the answer of that step streams
half its JSON, counts itself in the ledger (``axon_test_attempts``, key ``hold``) and
waits there: a worker killed then dies mid-answer, its earlier steps stored.
"""

from __future__ import annotations

import os

import pydantic

from actors.providers.scripted import ScriptedProvider, Sleep, tool_call
from runtime.actor_messages import InferRequest, RetryPrompt
from runtime.agent import Agent
from runtime.messages import AssistantMessage, UserMessage
from tests.support.worker_agent import _last_input, guarded, write_effect

WORDS = 12


class Answer(pydantic.BaseModel):
    words: list[str]
    total: int


def answer_json(tag: str, total: int) -> str:
    words = ", ".join(f'"{tag}w{i}"' for i in range(WORDS))
    return f'{{"words": [{words}], "total": {total}}}'


def _held(step: int, text: str) -> list:  # type: ignore[type-arg]
    if str(step) != os.environ.get("AXON_TEST_HOLD_STEP"):
        return [text]
    url = os.environ.get("AXON_TEST_LEDGER")
    if url:
        write_effect(url, "hold")
    half = len(text) // 2
    return [text[:half], Sleep(float(os.environ.get("AXON_TEST_HOLD", "600"))), text[half:]]


def answers_so_far(request: InferRequest) -> int:
    """The step this request is for: the turn's answers before it (its assistant message
    is split at each retry prompt, so :func:`current_step` sees the last piece only)."""
    steps: set[int] = set()
    for message in reversed(request.messages):
        if type(message) is UserMessage:
            break
        if isinstance(message, AssistantMessage):
            steps |= {p.step for p in message.content}
    return len(steps)


def respond(request: InferRequest) -> list:  # type: ignore[type-arg]
    user = _last_input(request)
    step = answers_so_far(request)
    if user.startswith("never"):
        return _held(step, f'{{"words": "not a list {step}", "total": 0}}')
    if (user.startswith("wrong") and step < 2) or (user.startswith("approve") and step == 0):
        return _held(step, f'{{"words": "not a list {step}", "total": 0}}')
    if user.startswith("approve") and step == 1:
        return tool_call("guarded", {"n": 1}, tool_call_id="call_a")
    prompts = sum(type(m) is RetryPrompt for m in request.messages)
    return _held(step, answer_json(os.environ.get("AXON_TEST_ANSWER_TAG", ""), prompts))


agent = Agent(
    name="worker-structured-test",
    provider=ScriptedProvider(
        responder=respond,
        delay=float(os.environ.get("AXON_TEST_DELAY", "0") or 0),
        keep_requests=0,
        chunk_size=8,
    ),
    instructions="test",
    tools=[guarded],
    output_type=Answer,
    output_retries=2,
)
"""The agent, for every session."""
