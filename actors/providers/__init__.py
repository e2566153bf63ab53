"""Provider actors, one module each; an SDK is imported only when its provider calls it."""

from __future__ import annotations

from typing import Any

__all__ = ["AnthropicProvider", "OpenAIProvider", "OpenAIResponsesProvider", "ScriptedProvider"]


def __getattr__(name: str) -> Any:  # lazy: importing a provider module never imports its SDK
    if name == "OpenAIProvider":
        from actors.providers.openai import OpenAIProvider

        return OpenAIProvider
    if name == "OpenAIResponsesProvider":
        from actors.providers.openai_responses import OpenAIResponsesProvider

        return OpenAIResponsesProvider
    if name == "AnthropicProvider":
        from actors.providers.anthropic import AnthropicProvider

        return AnthropicProvider
    if name == "ScriptedProvider":
        from actors.providers.scripted import ScriptedProvider

        return ScriptedProvider
    raise AttributeError(name)
