"""What the two OpenAI providers share: the same SDK, so the same errors and schemas.

Chat Completions (:mod:`actors.providers.openai`) and the Responses API
(:mod:`actors.providers.openai_responses`) are two actors over one SDK. What they have in
common lives here, in a module of their family, so neither imports the other:

* :func:`get_field`: a field of an SDK model or of a plain dict (the SDK leaves extra
  fields on its models; servers that speak the API add their own);
* :func:`classify_error`: the SDK's exceptions mapped onto :mod:`runtime.errors`, through
  the ladder every provider shares (:mod:`actors.providers.failures`);
* :func:`tool_name`: a stored call's name as both APIs' pattern takes it;
* :func:`json_schema_spec`: an agent's answer schema as the strict ``json_schema`` both
  APIs take (each wraps it its own way);
* :func:`tiktoken_encoding` / :func:`count_payload`: token counts of a request with
  ``tiktoken`` (an optional dependency), for context compaction;
* :func:`as_body` / :func:`body_keys`: the request's model, messages (or input items)
  and tools handed to the SDK as ``extra_body``, the same JSON body without the SDK's
  per-call transform of them;
* :class:`OpenAISDKProvider`: the base of both providers, which builds the SDK's client
  and counts tokens.

The ``openai`` SDK is imported inside functions only, so importing this module stays fast
and needs no SDK.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import trio

from actors.providers.failures import (
    classify_status,
    classify_transport,
    fitted_name,
    hook_error,
    missing_key,
    retry_after,
)
from actors.providers.sdk import SDKProvider, client_timeout
from runtime import errors
from runtime.errors import AxonError, ProviderError
from runtime.logging import get_logger
from runtime.messages import Message
from runtime.output_schema import strict_schema


def as_body(params: dict[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    """``params`` (a provider's ``create`` keyword arguments) with those of ``keys``
    given to ``create`` as ``extra_body``: the same JSON object, which the SDK merges as
    it is, instead of arguments it walks against its request types.

    Why: the SDK transforms every argument against its TypedDicts, each message or
    input item against every member of its union; with no alias or format among the
    Chat Completions and Responses request types that returns the data it was given, at
    0.2-0.5 ms per message and per call (Chat Completions: 0.44 ms for two messages,
    8.4 ms for 42; Responses: 0.53 ms for one input item, 23 ms for 41; issue 24: a
    per-turn cost that grew with the session). The walk costs even where the data is
    a string: ``model``'s type is a union with a ``Literal`` of every model name, which
    the SDK hashes through its caches on every call (about 60 us of a Chat Completions
    call, 80 us of a Responses one, as much as the rest of the walk; branch ``g1req``).
    The providers' ``map_messages`` and ``map_tools`` build the wire JSON themselves, so
    it is what the body must hold.

    Each moved key stays an argument, ``NOT_GIVEN`` (so that ``create`` has the
    arguments it requires, and its walk skips them as it skips every argument not
    given); the body holds the same members with the same values, in another order
    (JSON objects have none). An ``extra_body`` already in ``params`` (the request's
    options) keeps the last word on its own keys, as before."""
    moved = {key: params[key] for key in keys if key in params}
    if not moved:
        return params
    from openai import NOT_GIVEN  # the SDK is loaded: its client made ``create``

    out = {**params, **dict.fromkeys(moved, NOT_GIVEN)}
    extra = params.get("extra_body")
    out["extra_body"] = {**moved, **extra} if extra else moved
    return out


def body_keys(client: Any, keys: tuple[str, ...]) -> tuple[str, ...]:
    """``keys`` and ``model`` (:func:`as_body`'s keys for a call through ``client``),
    or ``keys`` alone for an Azure client, which reads the ``model`` argument before the
    body is merged to route the call to its deployment."""
    import openai

    return keys if isinstance(client, openai.AsyncAzureOpenAI) else ("model", *keys)


_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")
_NOT_NAME = re.compile(r"[^a-zA-Z0-9_-]")


def tool_name(name: str) -> str:
    """A call's name as a ``function.name`` (Chat Completions) or a ``function_call``'s
    ``name`` (Responses): ``^[a-zA-Z0-9_-]{1,64}$``, which both check in a request's
    history as in its tools; a name the model invented, or none, fitted to it
    (:func:`~actors.providers.failures.fitted_name`)."""
    return fitted_name(name, _NAME, _NOT_NAME, 64)


def get_field(obj: Any, key: str) -> Any:
    """A field of an SDK model (declared or extra) or of a plain dict; ``None`` if absent."""
    if obj is None:
        return None
    if isinstance(obj, dict):
        return obj.get(key)
    # Per chunk on the hot path: a declared field is in __dict__ and an extra one in
    # __pydantic_extra__; getattr on a missing field takes pydantic's slow path (~3 us).
    fields = getattr(obj, "__dict__", None)
    if fields is not None and key in fields:
        return fields[key]
    extra = getattr(obj, "__pydantic_extra__", None)
    if extra is not None:
        return extra.get(key)
    if fields is not None and hasattr(type(obj), "model_fields"):
        return None
    return getattr(obj, key, None)


def json_schema_spec(output: Any) -> dict[str, Any]:
    """The strict ``json_schema`` spec for an agent's
    :class:`~runtime.output_schema.OutputSchema`: its name, description and schema, the
    schema rewritten as strict mode needs (:func:`~runtime.output_schema.strict_schema`,
    which refuses what it cannot express)."""
    spec: dict[str, Any] = {"name": output.name, "schema": strict_schema(output.schema)}
    if output.description:
        spec["description"] = output.description
    spec["strict"] = True
    return spec


def _status_of(body: Any) -> int | None:
    # In-stream error objects carry no HTTP status; servers put it in the body instead
    # (Groq ``status_code: 400``, OpenRouter ``code: 400``). ASCII digits only:
    # ``"²".isdigit()`` is true and ``int("²")`` raises, which would turn a server's odd
    # error body into a crash of the classifier instead of a classified error.
    for key in ("status_code", "status", "code"):
        value = get_field(body, key)
        if isinstance(value, bool):
            continue
        if isinstance(value, int) or (
            isinstance(value, str) and value.isascii() and value.isdigit()
        ):
            return int(value)
    return None


def classify_error(exc: BaseException, *, provider: str = "openai") -> AxonError:
    """Map an exception from the SDK (or its transport) onto :mod:`runtime.errors`.

    An ``APIError`` is classified by :func:`~actors.providers.failures.classify_status`
    from its HTTP status, or for an error inside the stream (no status of its own) the
    status the body names, with the body's ``type`` and ``code`` words and the
    ``retry-after-ms`` / ``retry-after`` headers. The SDK's timeout ->
    :class:`ProviderTimeout`; its connection error -> :class:`ConnectionLost`; the HTTP
    library's errors while the stream is read, and undecodable data, by
    :func:`~actors.providers.failures.classify_transport`. An :class:`AxonError` is
    returned unchanged.
    """
    if isinstance(exc, AxonError):
        return exc
    import openai  # the SDK: loaded by the first call, never by importing Axon

    if isinstance(exc, openai.APITimeoutError):
        return errors.ProviderTimeout(str(exc), provider=provider)
    if isinstance(exc, openai.APIConnectionError):
        refused = hook_error(exc)  # a redirect off the endpoint's origin (StayHome)
        if refused is not None:
            return refused
        cause = exc.__cause__
        detail = f": {type(cause).__name__}: {cause}" if cause is not None else ""
        return errors.ConnectionLost(f"{exc}{detail}", provider=provider)
    if isinstance(exc, openai.APIError):
        body = exc.body
        message = get_field(body, "message")
        if not isinstance(message, str) or not message:
            message = exc.message
        response = getattr(exc, "response", None)
        return classify_status(
            message,
            provider=provider,
            status=getattr(exc, "status_code", None) or _status_of(body),
            error_type=exc.type,
            code=exc.code,
            retry_after=retry_after(response.headers if response is not None else None),
        )
    found = classify_transport(exc, provider=provider)
    if found is not None:
        return found
    return ProviderError(errors.describe_exception(exc), provider=provider)


# -- token counts (context compaction) ------------------------------------------------------

TIKTOKEN_LOAD_TIMEOUT = 10.0
"""Seconds loading a ``tiktoken`` encoding may take. The first load of an encoding
downloads its file (then cached in ``TIKTOKEN_CACHE_DIR``); offline, it never comes."""
FALLBACK_ENCODING = "o200k_base"
"""The encoding of models ``tiktoken`` does not know (a compatible server's): the one of
the GPT-4o, GPT-4.1, GPT-5 and o-series models."""
IMAGE_TOKENS = 765
"""Tokens counted per image: a high-detail 1024x1024 image (OpenAI's table)."""
MESSAGE_TOKENS = 3
"""Tokens every message or input item adds (its role and framing), as OpenAI's cookbook
counts them; three more prime the reply."""
_NOT_COUNTED = frozenset({"id", "call_id", "tool_call_id", "encrypted_content", "status"})
"""Keys whose values are not text the model reads (ids, opaque reasoning)."""

_encodings: dict[str, Any] = {}
"""Model -> its encoding, or ``None`` when ``tiktoken`` could not give one (not tried again)."""


def _load_encoding(model: str) -> Any:
    import tiktoken  # optional: pip install tiktoken

    try:
        return tiktoken.encoding_for_model(model)
    except KeyError:
        return tiktoken.get_encoding(FALLBACK_ENCODING)


async def tiktoken_encoding(model: str) -> Any | None:
    """The ``tiktoken`` encoding of ``model`` (:data:`FALLBACK_ENCODING` for one it does
    not know), loaded once per process in a thread; ``None`` when ``tiktoken`` is not
    installed or cannot load the encoding (offline, its file was never downloaded), said
    once in a log line: the caller falls back to the estimate."""
    if model in _encodings:
        return _encodings[model]
    encoding = None
    with trio.move_on_after(TIKTOKEN_LOAD_TIMEOUT):
        try:
            encoding = await trio.to_thread.run_sync(_load_encoding, model, abandon_on_cancel=True)
        except Exception as exc:  # ImportError, or the download failed
            get_logger("axon.compaction").warning(
                "compaction.tiktoken-unavailable",
                model=model,
                error=errors.describe_exception(exc),
                fallback="estimate",
            )
    _encodings[model] = encoding
    return encoding


def count_payload(encoding: Any, items: Sequence[Any]) -> int:
    """The tokens of a request's ``items`` (messages or input items, and tool
    definitions), as OpenAI's cookbook counts them: the text of every string value
    (ids and encrypted reasoning left out), :data:`MESSAGE_TOKENS` per item and for the
    reply, :data:`IMAGE_TOKENS` per image or file given as a data URL. Close to what the
    API bills for text; tool definitions are counted as their JSON, which the API
    formats otherwise (a few tokens off per tool)."""

    def walk(value: Any) -> int:
        if isinstance(value, str):
            if value.startswith("data:"):
                return IMAGE_TOKENS
            return len(encoding.encode(value, disallowed_special=()))
        if isinstance(value, dict):
            return sum(walk(v) for k, v in value.items() if k not in _NOT_COUNTED)
        if isinstance(value, list | tuple):
            return sum(walk(v) for v in value)
        return 0 if value is None or isinstance(value, bool) else walk(str(value))

    return MESSAGE_TOKENS + sum(MESSAGE_TOKENS + walk(item) for item in items)


class OpenAISDKProvider(SDKProvider):
    """A provider over the ``openai`` SDK's ``AsyncOpenAI`` client (Chat Completions, or
    the Responses API), for OpenAI and the servers that speak its API."""

    def count_items(
        self, instructions: str | None, messages: Sequence[Message], tools: Sequence[Any]
    ) -> list[Any]:
        """What :meth:`count_tokens` counts: the request's messages (or input items),
        instructions and tool definitions, as this API sends them."""
        raise NotImplementedError

    async def count_tokens(
        self, instructions: str | None, messages: Sequence[Message], tools: Sequence[Any]
    ) -> int | None:
        """The request's tokens counted with ``tiktoken`` (:func:`count_payload`);
        ``None`` (the caller estimates) when ``tiktoken`` is not available."""
        encoding = await tiktoken_encoding(self.model)
        if encoding is None:
            return None
        return count_payload(encoding, self.count_items(instructions, messages, tools))

    def new_client(self) -> Any:
        import openai  # the SDK: loaded by the first call, never by importing Axon

        try:
            return openai.AsyncOpenAI(
                api_key=self._api_key,
                base_url=self.base_url,
                timeout=client_timeout(self.timeout, openai.Timeout),
                max_retries=0,  # retries belong to the runtime (it knows what was emitted)
            )
        except openai.OpenAIError as exc:  # no key given and none in the environment
            raise missing_key(self.provider_name, "OPENAI_API_KEY") from exc
