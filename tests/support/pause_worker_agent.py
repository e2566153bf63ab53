"""The agent of the paused-takeover process test (``--agent
tests.support.pause_worker_agent:agent``): the real :class:`AnthropicProvider` on the
test's loopback Anthropic server, whose URL the test passes in ``AXON_TEST_ANTHROPIC_URL``
(read when a worker imports this module), and, with ``AXON_TEST_MAX_RESUMES``, the paused
calls a turn continues (:data:`actors.turn.runner.MAX_RESUMES`) in that worker."""

from __future__ import annotations

import os

from actors.providers.anthropic import AnthropicProvider
from actors.turn import runner
from runtime.agent import Agent

MODEL = "claude-sonnet-4-5"
KEY = "sk-ant-test-not-a-real-key"

if os.environ.get("AXON_TEST_MAX_RESUMES"):
    runner.MAX_RESUMES = int(os.environ["AXON_TEST_MAX_RESUMES"])

agent = Agent(
    name="worker-pause-test",
    provider=AnthropicProvider(
        MODEL,
        base_url=os.environ.get("AXON_TEST_ANTHROPIC_URL", "http://127.0.0.1:9"),
        api_key=KEY,
    ),
    instructions="test",
)
"""The agent, for every session."""
