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

Nothing here imports an SDK at import time; the Anthropic provider's own functions are
reached through the mixed-in class (``super()``), never imported.
"""

from __future__ import annotations

import os
from typing import Any, ClassVar, Self

from actors.providers.failures import classify_status
from actors.providers.sdk import SDKProvider
from runtime import errors
from runtime.actor_messages import InferRequest
from runtime.errors import AxonError
from runtime.history import Origin, endpoint_of
from runtime.provider import Emit, ProviderOptions

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


class _Platform(SDKProvider):
    """What Vertex and Bedrock add alike, for a class that also derives from the
    Anthropic provider (after this one: its methods are reached through ``super()``)."""

    @property
    def origin(self) -> Origin:
        """The tag is Anthropic's (the events are), the endpoint this platform's."""
        return Origin(provider=ANTHROPIC, model=self.model or None, endpoint=self.endpoint)

    def platform_error(self, exc: BaseException) -> AxonError | None:
        """What this platform says differently from Anthropic (``None``: nothing)."""
        return None

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
        kw: dict[str, Any] = {"max_retries": 0, "timeout": self.timeout}
        kw.update({key: value for key, value in given.items() if value is not None})
        try:
            return client_class(**kw)
        except ValueError as exc:
            raise errors.ConfigurationError(f"{self.provider_name}: {exc}") from exc

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
    if not region:
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

        given = {
            "region": self.region,
            "project_id": self.project_id,
            "access_token": self._api_key,
            "base_url": self.base_url,
        }
        return self._new_platform_client(AsyncAnthropicVertex, given)  # ValueError: no region

    def client_secrets(self, client: Any) -> tuple[str | None, ...]:
        return (client.access_token,)  # given; credentials found later stay Google's

    def platform_error(self, exc: BaseException) -> AxonError | None:
        if isinstance(exc, RuntimeError) and "project_id" in str(exc):
            return errors.ConfigurationError(f"anthropic-vertex: {exc}")
        return _auth_error(exc, self.provider_name)


# -- Bedrock --------------------------------------------------------------------------------


class BedrockPlatform(_Platform):
    """Claude on Amazon Bedrock (``AsyncAnthropicBedrock``), its stream in AWS event-stream
    frames; mixed into the Anthropic provider."""

    provider_name: ClassVar[str] = "anthropic-bedrock"
    install_extra: ClassVar[str | None] = "bedrock"
    price_vendor: ClassVar[str | None] = "aws"  # the price table's id for the platform
    endpoint_env: ClassVar[str | None] = "ANTHROPIC_BEDROCK_BASE_URL"

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
        default = f"https://bedrock-runtime.{region}.amazonaws.com" if region else None
        return self._endpoint_or(default)

    def describe_settings(self) -> dict[str, Any]:
        return {**super().describe_settings(), "region": self.region, "profile": self.aws_profile}

    def new_client(self) -> Any:
        """The ``AsyncAnthropicBedrock`` client, SDK retries off."""
        from anthropic import AsyncAnthropicBedrock  # the SDK: loaded by the first call only

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
        return _auth_error(exc, self.provider_name)
