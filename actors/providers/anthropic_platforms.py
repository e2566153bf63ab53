"""Claude on Google Cloud Vertex AI and on Amazon Bedrock, through the ``anthropic`` SDK's
own clients (``AsyncAnthropicVertex``, ``AsyncAnthropicBedrock``): what the platforms add
to the Anthropic provider, as the mixins :class:`VertexPlatform` and
:class:`BedrockPlatform`.

Both speak the Messages API: the request body is Anthropic's (the SDK moves ``model`` into
the URL and adds ``anthropic_version``), and the events are Anthropic's, so everything
but the client is the Anthropic provider's: the restoration, the stream parser, the error
ladder. The providers themselves are the Anthropic provider with a mixin in front
(``actors.providers.anthropic.AnthropicVertexProvider``, ``AnthropicBedrockProvider``):
this module is a helper of the provider family and imports no provider, so the providers
stay independent of each other (the import contracts). What differs is small and lives
here:

* **the client and its credentials**: Vertex takes a region and a project and an OAuth
  access token (``api_key`` here), else Google's Application Default Credentials (the
  ``vertex`` extra: ``google-auth``); Bedrock takes a region and either a Bedrock API key
  (a bearer token, ``api_key`` here or ``AWS_BEARER_TOKEN_BEDROCK``) or AWS credentials
  that the SDK signs each request with (SigV4; the ``bedrock`` extra: ``boto3``);
* **the endpoint** that reasoning is bound to: Vertex's regional
  ``aiplatform.googleapis.com``, Bedrock's ``bedrock-runtime.<region>.amazonaws.com``
  (or ``base_url``). The parts keep the tag ``anthropic`` (the events are Anthropic's),
  so a signature goes back only to the same platform, region and model;
* **Bedrock's stream**: AWS event-stream binary frames (decoded by the SDK with
  ``botocore``) whose error frames name AWS exceptions (``throttlingException``...)
  instead of Anthropic's error types; they are classified by the HTTP status the
  ``bedrock-runtime`` service model gives each (:data:`BEDROCK_STREAM_ERRORS`), and a
  frame that does not decode (a bad checksum) is :class:`~runtime.errors.MalformedStream`.

What a hostile or broken server (or configuration) met here, and is refused (branch
``platatk``): a region that is not a region's name (it is put in the host's name); the
credentials the SDK found itself (an access token of Google's, an AWS session token)
echoed in an error; an AWS session token carried on to another host by a redirect; a
Bedrock frame that does not decode, skipped or reported as a bug; a missing extra.

Nothing here imports an SDK at import time; the Anthropic provider's own functions are
reached through the mixed-in class (``super()``), never imported.
"""

from __future__ import annotations

import base64
import functools
import importlib
import json
import os
import re
from collections.abc import AsyncIterator
from typing import Any, ClassVar, Self

from actors.providers.failures import QUOTE_MARGIN, classify_status, quoted
from actors.providers.sdk import SDKProvider, client_timeout
from runtime import errors
from runtime.actor_messages import InferRequest
from runtime.errors import AxonError
from runtime.history import Origin, endpoint_of
from runtime.provider import Emit, ProviderOptions
from runtime.redact import register_secret

ANTHROPIC = "anthropic"
"""The tag the Anthropic provider puts on its reasoning and its errors: the events are
Anthropic's on every platform, so the parts keep it."""

BEDROCK_STREAM_ERRORS: dict[str, int] = {
    "throttlingException": 429,
    "modelNotReadyException": 429,
    "serviceUnavailableException": 503,
    "internalServerException": 500,
    "modelStreamErrorException": 500,
    "modelTimeoutException": 408,
    "validationException": 400,
    "accessDeniedException": 403,
    "resourceNotFoundException": 404,
}
"""An exception named in a Bedrock stream's error frame -> the HTTP status it has in the
``bedrock-runtime`` service model, so it classifies like the same failure before the
stream. One exception: ``modelStreamErrorException`` is 424 there, but AWS documents it as
"an error occurred while streaming the response: retry", so it is a server error here."""


REGION = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")
"""A region's name as both clouds spell them (``us-east-1``, ``us-gov-west-1``,
``europe-west1``, ``global``, ``eu``). Why it is checked: the SDKs put the region in the
endpoint's host name (``https://{region}-aiplatform.googleapis.com``,
``bedrock-runtime.{region}.amazonaws.com``), so a region such as ``evil.example#`` (from
``CLOUD_ML_REGION`` or ``AWS_REGION``) sent the access token or Bedrock API key to
``evil.example`` (branch ``platatk``)."""

BEDROCK_HEAD = 40
"""Bytes of a Bedrock body that is no event stream its error quotes."""


def valid_region(region: str | None) -> bool:
    return region is not None and REGION.fullmatch(region) is not None


SENT_CREDENTIALS = ("authorization", "x-amz-security-token")
"""The request headers that carry a credential on these platforms: Google's access token
or the Bedrock API key (``Bearer ...``), the AWS session token. The SDK resolves them
itself on the first request (Application Default Credentials, boto3's chain: the
environment, the profile), so they are registered as secrets as they are sent."""


def _register_sent(headers: Any) -> None:
    for name in SENT_CREDENTIALS:
        value = headers.get(name)
        if value:
            scheme, _, token = value.partition(" ")
            if scheme.lower() == "bearer":
                register_secret(token)
            elif name != "authorization":  # a SigV4 signature is of this request only
                register_secret(value)


def _missing_extra(
    exc: BaseException, provider: str, extra: str, libraries: str
) -> AxonError | None:
    """The error of an optional dependency that is not installed: what to install."""
    if isinstance(exc, ImportError) or type(exc).__name__ == "MissingDependencyError":
        return errors.ConfigurationError(
            f"{provider} cannot run without {libraries}: pip install 'axon-runtime[{extra}]'"
        )
    return None


class _Platform(SDKProvider):
    """What Vertex and Bedrock add alike, for a class that also derives from the
    Anthropic provider (after this one: its methods are reached through ``super()``)."""

    extra: ClassVar[str] = ""
    """The ``axon-runtime`` extra that installs what this platform needs."""
    extra_libraries: ClassVar[str] = ""

    @property
    def origin(self) -> Origin:
        """The tag is Anthropic's (the events are), the endpoint this platform's."""
        return Origin(provider=ANTHROPIC, model=self.model or None, endpoint=self.endpoint)

    def _endpoint_or(self, default: str | None) -> str | None:
        """The endpoint: ``base_url``, else the platform's :attr:`endpoint_env`, else
        ``default`` (the SDK's for the region; ``None``: none known)."""
        url = self.base_url or os.environ.get(self.endpoint_env or "") or None
        url = url or default
        return endpoint_of(url) if url else None

    def _new_platform_client(self, client_class: Any, given: dict[str, Any]) -> Any:
        """``client_class`` (the platform's SDK client) with the settings ``given`` that
        are not ``None``, SDK retries off; the SDK's ``ValueError`` (a region or
        credentials missing or clashing) is a configuration error."""
        from anthropic import Timeout  # (the platform's client imported it already)

        kw: dict[str, Any] = {"max_retries": 0, "timeout": client_timeout(self.timeout, Timeout)}
        kw.update({key: value for key, value in given.items() if value is not None})
        try:
            client = client_class(**kw)
        except ValueError as exc:
            raise errors.ConfigurationError(f"{self.provider_name}: {exc}") from exc
        except ImportError as exc:
            raise self.platform_error(exc) or exc from exc
        region = self.client_region(client)
        if not valid_region(region):  # before any request: it names the host
            raise errors.ConfigurationError(
                f"{self.provider_name}: {region!r} is not a region's name "
                "(letters, digits and single hyphens, such as us-east-1)"
            )
        return client

    def client_region(self, client: Any) -> str | None:
        """The region ``client`` resolved (given, or the SDK's from the environment)."""
        raise NotImplementedError

    def prepare_client(self, client: Any) -> None:
        """Also: register the credentials each request carries as secrets (the SDK
        finds them itself, on the first request). A redirect to another origin, which
        would carry ``x-amz-security-token`` there (the HTTP library strips only
        ``Authorization``), is refused before it is sent (``StayHome``, added by
        :meth:`SDKProvider.prepare_client` for every provider)."""
        super().prepare_client(client)
        prepare = client._prepare_request

        async def prepare_request(request: Any) -> None:
            await prepare(request)
            _register_sent(request.headers)

        client._prepare_request = prepare_request

    def platform_error(self, exc: BaseException) -> AxonError | None:
        """What this platform says differently from Anthropic (``None``: nothing)."""
        return _missing_extra(exc, self.provider_name, self.extra, self.extra_libraries)

    def classify_error(self, exc: BaseException) -> AxonError:
        if isinstance(exc, AxonError):
            return exc
        found = (
            self.missing_dependency(exc) or self.platform_error(exc) or super().classify_error(exc)
        )
        if isinstance(found, errors.ProviderError):
            found.provider = self.provider_name
        return found

    async def stream(self, request: InferRequest, emit: Emit) -> None:
        """Anthropic's call; what it classified is looked at again for this platform."""
        try:
            await super().stream(request, emit)
        except errors.ProviderError as err:
            if err.provider != ANTHROPIC:
                raise
            cause = err.__cause__
            if cause is not None and not isinstance(cause, AxonError):
                # google-auth or botocore, imported by the SDK when it signs a request
                better = self.missing_dependency(cause) or self.platform_error(cause)
                if better is not None:
                    raise better from cause
            err.provider = self.provider_name
            raise


def _auth_error(exc: BaseException, provider: str) -> AxonError | None:
    """Credentials that could not be found or refreshed, from Google's or AWS's library."""
    module = type(exc).__module__ or ""
    name = type(exc).__name__
    if module.startswith("google.auth") or module.startswith("botocore"):
        if "Credential" in name or "Refresh" in name or "Token" in name:
            return errors.AuthenticationFailed(f"{name}: {exc}", provider=provider)
    if isinstance(exc, RuntimeError) and "Could not resolve" in str(exc):
        return errors.AuthenticationFailed(str(exc), provider=provider)
    return None


# -- Vertex AI ------------------------------------------------------------------------------


def vertex_endpoint(region: str | None) -> str | None:
    """The SDK's default Vertex endpoint for ``region`` (``None``: no region known)."""
    if not valid_region(region):
        return None
    if region == "global":
        return "https://aiplatform.googleapis.com/v1"
    if region in ("us", "eu"):
        return f"https://aiplatform.{region}.rep.googleapis.com/v1"
    return f"https://{region}-aiplatform.googleapis.com/v1"


class VertexPlatform(_Platform):
    """Claude on Vertex AI (``AsyncAnthropicVertex``); mixed into the Anthropic provider."""

    provider_name: ClassVar[str] = "anthropic-vertex"
    install_extra: ClassVar[str | None] = "vertex"
    price_vendor: ClassVar[str | None] = "google"  # the price table's id for the platform
    endpoint_env: ClassVar[str | None] = "ANTHROPIC_VERTEX_BASE_URL"
    extra: ClassVar[str] = "vertex"
    extra_libraries: ClassVar[str] = "google-auth (Application Default Credentials)"

    def __init__(
        self,
        model: str,
        *,
        region: str | None = None,
        project_id: str | None = None,
        access_token: str | None = None,
        base_url: str | None = None,
        **kw: Any,
    ) -> None:
        """``region`` (else ``CLOUD_ML_REGION``), ``project_id`` (else
        ``ANTHROPIC_VERTEX_PROJECT_ID``, else the credentials'), ``access_token`` (else
        Application Default Credentials); the rest is the Anthropic provider's."""
        super().__init__(model, base_url=base_url, api_key=access_token, **kw)
        self.region = region
        self.project_id = project_id

    @classmethod
    def from_options(cls, options: ProviderOptions) -> Self:
        """``--provider anthropic-vertex``: ``--model`` (default
        ``claude-sonnet-4-5@20250929``), ``--api-key`` (an access token; default: ADC),
        ``--base-url``, ``--thinking-budget``; region and project from ``CLOUD_ML_REGION``
        and ``ANTHROPIC_VERTEX_PROJECT_ID``."""
        return cls(
            options.model or "claude-sonnet-4-5@20250929",
            access_token=options.api_key,
            base_url=options.base_url,
            thinking_budget=options.thinking_budget,
        )

    @property
    def endpoint(self) -> str | None:
        return self._endpoint_or(vertex_endpoint(self.region or os.environ.get("CLOUD_ML_REGION")))

    def describe_settings(self) -> dict[str, Any]:
        return {**super().describe_settings(), "region": self.region, "project_id": self.project_id}

    def new_client(self) -> Any:
        """The ``AsyncAnthropicVertex`` client, SDK retries off."""
        from anthropic import AsyncAnthropicVertex  # the SDK: loaded by the first call only

        if not self._api_key:
            # Application Default Credentials need google-auth (the vertex extra). Looked
            # for before the SDK's constructor, which asks for a region first: on the core
            # install, a region set, then "install the extra" (an access token needs none).
            try:
                importlib.import_module("google.auth")
            except ImportError as exc:
                raise self.platform_error(exc) or exc from exc
        given = {
            "region": self.region,
            "project_id": self.project_id,
            "access_token": self._api_key,
            "base_url": self.base_url,
        }
        return self._new_platform_client(AsyncAnthropicVertex, given)  # ValueError: no region

    def client_secrets(self, client: Any) -> tuple[str | None, ...]:
        return (client.access_token,)  # given; ADC's tokens are registered as sent

    def client_region(self, client: Any) -> str | None:
        return client.region

    def platform_error(self, exc: BaseException) -> AxonError | None:
        if isinstance(exc, RuntimeError) and "project_id" in str(exc):
            return errors.ConfigurationError(f"anthropic-vertex: {exc}")
        return _auth_error(exc, self.provider_name) or super().platform_error(exc)


# -- Bedrock --------------------------------------------------------------------------------


class BedrockPlatform(_Platform):
    """Claude on Amazon Bedrock (``AsyncAnthropicBedrock``), its stream in AWS event-stream
    frames; mixed into the Anthropic provider."""

    provider_name: ClassVar[str] = "anthropic-bedrock"
    install_extra: ClassVar[str | None] = "bedrock"
    price_vendor: ClassVar[str | None] = "aws"  # the price table's id for the platform
    endpoint_env: ClassVar[str | None] = "ANTHROPIC_BEDROCK_BASE_URL"
    extra: ClassVar[str] = "bedrock"
    extra_libraries: ClassVar[str] = "boto3 and botocore (SigV4 signing, event-stream frames)"

    def __init__(
        self,
        model: str,
        *,
        region: str | None = None,
        api_key: str | None = None,
        aws_access_key: str | None = None,
        aws_secret_key: str | None = None,
        aws_session_token: str | None = None,
        aws_profile: str | None = None,
        base_url: str | None = None,
        **kw: Any,
    ) -> None:
        """``region`` (else ``AWS_REGION`` / ``AWS_DEFAULT_REGION`` / the profile's);
        ``api_key`` a Bedrock API key (else ``AWS_BEARER_TOKEN_BEDROCK``) or the AWS
        credentials (else boto3's usual chain); the rest is the Anthropic provider's."""
        super().__init__(model, base_url=base_url, api_key=api_key, **kw)
        self.region = region
        self.aws_profile = aws_profile
        self._aws = {  # private: never logged, never in describe()
            "aws_access_key": aws_access_key,
            "aws_secret_key": aws_secret_key,
            "aws_session_token": aws_session_token,
        }

    @classmethod
    def from_options(cls, options: ProviderOptions) -> Self:
        """``--provider anthropic-bedrock``: ``--model`` (default
        ``anthropic.claude-sonnet-4-5-20250929-v1:0``), ``--api-key`` (a Bedrock API key;
        default: ``AWS_BEARER_TOKEN_BEDROCK``, else the AWS credentials), ``--base-url``,
        ``--thinking-budget``; the region from ``AWS_REGION``."""
        return cls(
            options.model or "anthropic.claude-sonnet-4-5-20250929-v1:0",
            api_key=options.api_key,
            base_url=options.base_url,
            thinking_budget=options.thinking_budget,
        )

    @property
    def endpoint(self) -> str | None:
        region = self.region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
        default = (
            f"https://bedrock-runtime.{region}.amazonaws.com" if valid_region(region) else None
        )
        return self._endpoint_or(default)

    def describe_settings(self) -> dict[str, Any]:
        return {**super().describe_settings(), "region": self.region, "profile": self.aws_profile}

    def new_client(self) -> Any:
        """The ``AsyncAnthropicBedrock`` client, SDK retries off. Its stream needs
        ``botocore`` even with an API key: without it, the call fails here, before the
        request is sent (and paid for)."""
        from anthropic import AsyncAnthropicBedrock  # the SDK: loaded by the first call only

        try:
            import botocore.eventstream  # type: ignore[import-untyped]  # noqa: F401
        except ImportError as exc:
            raise self.platform_error(exc) or exc from exc

        given = {
            "aws_region": self.region,
            "aws_profile": self.aws_profile,
            "api_key": self._api_key,
            "base_url": self.base_url,
            **self._aws,
        }
        # ValueError: no region anywhere, or a key and credentials both
        return self._new_platform_client(AsyncAnthropicBedrock, given)

    def client_secrets(self, client: Any) -> tuple[str | None, ...]:
        # the bearer key (given or AWS_BEARER_TOKEN_BEDROCK) and the AWS secrets given
        return (client.api_key, self._aws["aws_secret_key"], self._aws["aws_session_token"])

    def client_region(self, client: Any) -> str | None:
        return client.aws_region

    def prepare_client(self, client: Any) -> None:
        """Also: the event-stream frames read by :func:`frame_decoder_class`'s decoder."""
        super().prepare_client(client)
        make = client._make_sse_decoder

        def make_decoder(*args: Any, **kw: Any) -> Any:
            decoder = make(*args, **kw)
            strict = frame_decoder_class()
            return strict() if strict is not None and type(decoder) in strict.__bases__ else decoder

        client._make_sse_decoder = make_decoder

    def platform_error(self, exc: BaseException) -> AxonError | None:
        import anthropic as sdk

        if isinstance(exc, sdk.APIStatusError) and exc.status_code < 400:
            status = BEDROCK_STREAM_ERRORS.get(getattr(exc, "type", None) or "")
            if status is not None:  # an error frame inside the stream
                return classify_status(
                    getattr(exc, "api_message", None) or str(exc.message),
                    provider=self.provider_name,
                    status=status,
                    error_type=getattr(exc, "type", None),
                )
        if type(exc).__module__ == "botocore.eventstream":  # a frame that does not decode
            return errors.MalformedStream(
                f"undecodable event-stream frame: {type(exc).__name__}: {exc}",
                provider=self.provider_name,
            )
        if type(exc).__module__.startswith("botocore") and type(exc).__name__ in AWS_CONFIG_ERRORS:
            return errors.ConfigurationError(f"{self.provider_name}: {exc}")
        return _auth_error(exc, self.provider_name) or super().platform_error(exc)


AWS_CONFIG_ERRORS = frozenset(
    {"ProfileNotFound", "ConfigNotFound", "ConfigParseError", "InvalidConfigError"}
)
"""botocore's errors of an AWS configuration that cannot be used (``AWS_PROFILE`` naming no
profile...): a ConfigurationError, where they were a ``ProviderError`` (branch ``platatk``)."""


def _bad_frame(what: str) -> errors.MalformedStream:
    return errors.MalformedStream(what, provider=BedrockPlatform.provider_name)


@functools.cache
def frame_decoder_class() -> type | None:
    """A subclass of the SDK's ``AWSEventStreamDecoder`` that refuses the frames that do
    not decode (used in place of that one only, not of the SDK's SSE decoder of the
    control plane's calls); ``None`` for an SDK without the functions it builds on.

    Why: the SDK handed a ``chunk`` frame to botocore's parser, which made nothing of a
    payload that is not JSON, not base64 or without ``bytes``, and the SDK skipped what
    came out empty: a garbled text delta in the middle was dropped and the answer,
    a piece short, finished as whole. A frame whose headers do not decode raised
    botocore's ``KeyError`` (an unknown value type), reported as a bug, not retried. An
    error frame naming an exception the service model does not list came out as an
    error with no type and no message. Here a ``chunk`` frame's payload is read as
    Bedrock sends it (``{"bytes": base64(one Messages API event)}``) or is
    :class:`~runtime.errors.MalformedStream`; so is a frame botocore cannot decode; and an
    ``exception`` or ``error`` frame becomes the SDK's error event with the type and
    message the frame's headers and payload carry (branch ``platatk``)."""
    try:
        from anthropic.lib.bedrock import _stream_decoder as sdk
    except ImportError:
        return None
    base: Any = getattr(sdk, "AWSEventStreamDecoder", None)
    to_sse: Any = getattr(sdk, "_chunk_bytes_to_sse", None)
    server_sent_event: Any = getattr(sdk, "ServerSentEvent", None)
    if base is None or to_sse is None or server_sent_event is None:
        return None

    class FrameDecoder(base):  # type: ignore[misc, valid-type]
        reads_body = True
        """Given the body's bytes by :func:`~actors.providers.sse.body_bytes`, which
        closes them (:func:`~actors.providers.sse.event_batches`)."""

        async def aiter_bytes(self, iterator: AsyncIterator[bytes]) -> AsyncIterator[Any]:
            from botocore.eventstream import EventStreamBuffer  # type: ignore[import-untyped]

            frames = EventStreamBuffer()
            head = b""  # the body's first bytes, until a frame is read
            read = False
            async for data in iterator:
                frames.add_data(data)
                if not read and len(head) < BEDROCK_HEAD + QUOTE_MARGIN:
                    head += data[: BEDROCK_HEAD + QUOTE_MARGIN - len(head)]
                while True:
                    try:
                        frame = next(frames)
                    except StopIteration:
                        break
                    except Exception as exc:  # botocore's, or its KeyError / struct.error
                        said = f"{type(exc).__name__}: {exc}"
                        if not read:  # an HTML page, a JSON body, SSE: say what came
                            said = f"it begins {quoted(head, BEDROCK_HEAD)} ({said})"
                            raise _bad_frame(
                                f"the body holds no event-stream frames: {said}"
                            ) from exc
                        raise _bad_frame(f"undecodable event-stream frame: {said}") from exc
                    read = True
                    event = self._parse_message_from_event(frame)
                    if event is not None:
                        yield event
            if not read:  # not even a whole first frame
                said = f"it begins {quoted(head, BEDROCK_HEAD)}" if head else "it is empty"
                raise _bad_frame(f"the body holds no event-stream frames: {said}")

        def _parse_message_from_event(self, frame: Any) -> Any:
            headers = frame.headers
            kind = headers.get(":message-type")
            if kind in ("exception", "error"):
                return server_sent_event(data=json.dumps(_frame_error(frame)), event="error")
            if headers.get(":event-type") != "chunk":
                return None  # an event of another type: none the Messages API sends
            try:
                payload = json.loads(frame.payload)
                raw = base64.b64decode(payload["bytes"], validate=True)
            except (ValueError, KeyError, TypeError) as exc:
                raise _bad_frame(
                    f"a Bedrock chunk that does not decode ({type(exc).__name__}: {exc}): "
                    f"{quoted(bytes(frame.payload[: 200 + QUOTE_MARGIN]))}"
                ) from exc
            return to_sse(raw)

    return FrameDecoder


def _frame_error(frame: Any) -> dict[str, Any]:
    """The SDK's error event for an ``exception`` frame (``:exception-type``, the
    payload's ``message``) or an ``error`` frame (``:error-code``, ``:error-message``)."""
    headers = frame.headers
    if headers.get(":message-type") == "error":
        name, message = headers.get(":error-code"), headers.get(":error-message")
    else:
        name, message = headers.get(":exception-type"), None
        text = bytes(frame.payload).decode("utf-8", "replace")
        try:
            body = json.loads(text)
        except ValueError:
            body = None
        if isinstance(body, dict):
            found = body.get("message") or body.get("Message")
            message = found if isinstance(found, str) else text
        else:
            message = text
    return {"type": "error", "error": {"type": str(name or ""), "message": str(message or "")}}
