"""The shipped kits (:mod:`runtime.testing`): the provider kit over every built-in
provider, and both kits run from outside the project as a plug-in's tests run them.

Each SDK provider answers from the loopback server, replaying the project's own text
recording (``tests/recordings``) once per call; the scripted provider answers from its
script. The store kit runs over the built-in stores in tests/test_stores.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from actors.providers import (
    AnthropicBedrockProvider,
    AnthropicProvider,
    AnthropicVertexProvider,
    GeminiProvider,
    OpenAIProvider,
    OpenAIResponsesProvider,
    ScriptedProvider,
)
from runtime.chunks import FinishChunk, TextChunk, ToolInputDeltaChunk, ToolInputStartChunk
from runtime.provider import Provider
from runtime.testing.providers import ProviderConformance, check_stream
from tests.support.eventstream import bedrock_stream
from tests.support.loopback import Reply, loopback_server

ROOT = Path(__file__).resolve().parents[1]
RECORDINGS = ROOT / "tests" / "recordings"
KEY = "sk-test-kit-0123456789"
CALLS = 3
"""Replies each server holds: the kit makes at most this many calls per test."""


@asynccontextmanager
async def serving(recording: str) -> AsyncIterator[str]:
    """The loopback server's URL, replaying ``recording`` for each of :data:`CALLS` calls."""
    body = (RECORDINGS / recording).read_bytes()
    async with loopback_server(*[Reply(body=body, write_events=True)] * CALLS) as server:
        yield server.url


class TestScriptedProvider(ProviderConformance):
    @pytest.fixture
    def provider(self) -> Provider:
        return ScriptedProvider(["Hello there, how are you?"])


class TestOpenAIProvider(ProviderConformance):
    @pytest.fixture
    def provider_secret(self) -> str:
        return KEY

    @pytest.fixture
    async def provider(self, provider_secret: str) -> AsyncIterator[Provider]:
        async with serving("openai/text-plain.sse") as url:
            provider = OpenAIProvider("gpt-4o-mini", base_url=url + "/v1", api_key=provider_secret)
            try:
                yield provider
            finally:
                await provider.aclose()


class TestOpenAIResponsesProvider(ProviderConformance):
    @pytest.fixture
    def provider_secret(self) -> str:
        return KEY

    @pytest.fixture
    async def provider(self, provider_secret: str) -> AsyncIterator[Provider]:
        async with serving("openai-responses/text.sse") as url:
            provider = OpenAIResponsesProvider(
                "gpt-5-mini", base_url=url + "/v1", api_key=provider_secret
            )
            try:
                yield provider
            finally:
                await provider.aclose()


class TestAnthropicProvider(ProviderConformance):
    @pytest.fixture
    def provider_secret(self) -> str:
        return KEY

    @pytest.fixture
    async def provider(self, provider_secret: str) -> AsyncIterator[Provider]:
        async with serving("anthropic/text.sse") as url:
            provider = AnthropicProvider("claude-sonnet-4-5", base_url=url, api_key=provider_secret)
            try:
                yield provider
            finally:
                await provider.aclose()


class TestGeminiProvider(ProviderConformance):
    @pytest.fixture
    def provider_secret(self) -> str:
        return KEY

    @pytest.fixture
    async def provider(self, provider_secret: str) -> AsyncIterator[Provider]:
        async with serving("google/text.sse") as url:
            provider = GeminiProvider("gemini-2.5-flash", base_url=url, api_key=provider_secret)
            try:
                yield provider
            finally:
                await provider.aclose()


class TestAnthropicVertexProvider(ProviderConformance):
    @pytest.fixture
    def provider_secret(self) -> str:
        return KEY

    @pytest.fixture
    async def provider(self, provider_secret: str) -> AsyncIterator[Provider]:
        async with serving("anthropic/text.sse") as url:
            provider = AnthropicVertexProvider(
                "claude-sonnet-4-5@20250929",
                base_url=url,
                region="us-east5",
                project_id="kit-project",
                access_token=provider_secret,
            )
            try:
                yield provider
            finally:
                await provider.aclose()


class TestAnthropicBedrockProvider(ProviderConformance):
    @pytest.fixture
    def provider_secret(self) -> str:
        return KEY

    @pytest.fixture
    async def provider(self, provider_secret: str) -> AsyncIterator[Provider]:
        events = [
            json.loads(line.removeprefix("data: "))
            for line in (RECORDINGS / "anthropic/text.sse").read_text().splitlines()
            if line.startswith("data: ")
        ]
        body = bedrock_stream(*[e for e in events if e["type"] != "ping"])
        reply = Reply(body=body, content_type="application/vnd.amazon.eventstream", write_size=64)
        async with loopback_server(*[reply] * CALLS) as server:
            provider = AnthropicBedrockProvider(
                "anthropic.claude-sonnet-4-5-20250929-v1:0",
                base_url=server.url,
                region="us-east-1",
                aws_access_key="AKIDEXAMPLE0123456789",
                aws_secret_key=provider_secret,
            )
            try:
                yield provider
            finally:
                await provider.aclose()


# -- the kit's own checks fail when they should -------------------------------------------


def test_check_stream_refuses_a_call_without_its_finish():
    with pytest.raises(AssertionError, match="one FinishChunk, last"):
        check_stream([TextChunk(text="hi")])


def test_check_stream_refuses_a_tool_input_delta_before_its_start():
    chunks = [
        ToolInputDeltaChunk(tool_call_id="c1", delta="{}"),
        ToolInputStartChunk(tool_call_id="c1", tool_name="t"),
        FinishChunk(reason="tool-calls"),
    ]
    with pytest.raises(AssertionError, match="a delta before its start"):
        check_stream(chunks)


PLUGIN_TESTS = """
import attrs
import pytest
import trio

from runtime.chunks import FinishChunk, TextChunk
from runtime.provider import Provider
from actors.stores import MemoryStore
from runtime.testing.providers import ProviderConformance
from runtime.testing.stores import StoreConformance


class ForgetsMeta(MemoryStore):
    async def load(self, session_id):
        found = await super().load(session_id)
        return None if found is None else attrs.evolve(found, meta={})


class TestForgetsMeta(StoreConformance):
    @pytest.fixture
    async def store(self):
        store = ForgetsMeta()
        yield store
        await store.aclose()


class SwallowsCancel(Provider):
    provider_name = "swallows"

    async def stream(self, request, emit):
        try:
            await emit(TextChunk(text="hi"))
            await trio.sleep(0)
        except BaseException:
            pass
        await emit(FinishChunk(reason="stop"))


class TestSwallowsCancel(ProviderConformance):
    @pytest.fixture
    def provider(self):
        return SwallowsCancel(model="m")
"""


def test_a_plugins_tests_run_the_kits_and_fail_a_broken_store_and_provider(tmp_path):
    (tmp_path / "test_plugin.py").write_text(PLUGIN_TESTS)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # as if installed; not Axon's config
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rf", "test_plugin.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    failed = {line.split()[1] for line in result.stdout.splitlines() if line.startswith("FAILED")}
    assert "test_plugin.py::TestForgetsMeta::test_meta_merges_shallowly" in failed
    assert (
        "test_plugin.py::TestSwallowsCancel::test_answers_again_after_a_call_cancelled_mid_stream"
        in failed
    )
    assert "test_plugin.py::TestForgetsMeta::test_delete" not in failed, result.stdout[-2000:]
