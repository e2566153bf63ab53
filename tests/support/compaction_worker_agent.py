"""The worker tests' agent with a summarizing history processor
(``--agent tests.support.compaction_worker_agent:agent``).

Every turn answers as :mod:`tests.support.worker_agent`'s do; before each model call
:class:`~runtime.compaction.Summarize` (``max_tokens=`` :data:`WINDOW`, one turn kept)
summarizes the older turns of a long session with a call to the same scripted provider,
which answers it with :data:`SUMMARY_TEXT`. Each summary call is counted in the ledger
(``axon_test_attempts``, key ``summary``) before it answers, and
``AXON_TEST_SUMMARY_HOLD`` (seconds) holds it there: a worker killed then dies inside the
summary's model call. ``AXON_TEST_STEP1_HOLD`` (seconds) holds a turn's step 1 model call
before it answers: a worker killed then dies after step 0 (and the summary made before
it) was stored.
"""

from __future__ import annotations

import os

from actors.providers.scripted import ScriptedProvider, Sleep, current_step
from runtime.actor_messages import InferRequest
from runtime.agent import Agent
from runtime.compaction import SUMMARY_INSTRUCTIONS, Summarize
from tests.support.worker_agent import die, guarded, record, respond, write_effect

WINDOW = 300
"""The processor's ``max_tokens``: a few long turns are over it, the current turn alone
is not."""
SUMMARY_TEXT = "the user asked long questions and got long answers"


def respond_or_summarize(request: InferRequest) -> list:  # type: ignore[type-arg]
    if request.instructions != SUMMARY_INSTRUCTIONS:
        hold = float(os.environ.get("AXON_TEST_STEP1_HOLD", "0") or 0)
        if hold and current_step(request.messages) == 1:
            return [Sleep(hold), *respond(request)]
        return respond(request)
    url = os.environ.get("AXON_TEST_LEDGER")
    if url:  # an attempt row per call (the effect row is once for the key: unused)
        write_effect(url, "summary")
    hold = float(os.environ.get("AXON_TEST_SUMMARY_HOLD", "0") or 0)
    return [*([Sleep(hold)] if hold else []), SUMMARY_TEXT]


agent = Agent(
    name="worker-compaction-test",
    provider=ScriptedProvider(
        responder=respond_or_summarize,
        delay=float(os.environ.get("AXON_TEST_DELAY", "0") or 0),
        keep_requests=0,
        chunk_size=8,
    ),
    instructions="test",
    tools=[record, guarded, die],
    history_processors=[Summarize(max_tokens=WINDOW, keep_turns=1)],
)
"""The agent, for every session."""
