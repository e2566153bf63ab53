"""The agent of the paused-takeover process test (``--agent
tests.support.pause_worker_agent:agent``): the real :class:`AnthropicProvider` on the
test's loopback Anthropic server, whose URL the test passes in ``AXON_TEST_ANTHROPIC_URL``
(read when a worker imports this module)."""

from __future__ import annotations

import os

from actors.providers.anthropic import AnthropicProvider
from runtime.agent import Agent

MODEL = "claude-sonnet-4-5"
KEY = "sk-ant-test-not-a-real-key"

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
