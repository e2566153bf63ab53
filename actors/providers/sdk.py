"""What every provider over a vendor's SDK sets up the same way, written once.

The OpenAI Chat Completions, OpenAI Responses and Anthropic providers each call their
vendor through its Python SDK. :class:`SDKProvider` holds what they share: the
constructor's common arguments (model, endpoint, key, timeout, concurrency, extra request
options, foreign reasoning), the client built on the first call (with the SDK's own
retries off: the turn runner retries, and it knows what was already streamed), the
resolved credentials registered as secrets so no error text ever shows them, the names
the SDK's ``create`` takes, and closing the client. A subclass builds its SDK's client
(:meth:`SDKProvider.new_client`) and keeps the rest of what it knows: its request format
and its stream.

The SDK itself is imported by :meth:`~SDKProvider.new_client` only, so importing a
provider module (or ``runtime``) loads no SDK.
"""

from __future__ import annotations

import inspect
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import Any, ClassVar

from actors.providers.failures import stay_home
from runtime import errors
from runtime.history import ForeignReasoning
from runtime.provider import CALL_TIMEOUT, IDLE_TIMEOUT, Provider
from runtime.ratelimit import RateLimit
from runtime.redact import (
    header_secrets,
    register_secret,
    register_secrets,
    register_url_secrets,
)

SDK_BASE_MODULES = frozenset({"openai._base_client", "anthropic._base_client"})
"""The modules of the SDKs' base clients, whose ``_prepare_url`` :func:`cache_prepared_urls`
may remember (a client class that defines its own is left alone)."""
PREPARED_URLS = 64
"""URLs a client's cache holds before it starts over (a provider calls one or two)."""


def cache_prepared_urls(client: Any) -> None:
    """Have ``client`` (an SDK client) build the URL of each endpoint once, not once a
    call.

    Why: the SDKs' base client joins the endpoint's path to ``base_url`` on every request
    (``_prepare_url``: the path parsed as an ``httpx.URL``, then the base copied with the
    joined path, which parses it again), 40-60 us of a one-delta call's CPU through the
    SDK (branch ``g1sdk``), for the same URL each time. The base client's version is a
    function of ``base_url`` and the path alone, and the URL it returns is immutable
    (the SDK copies it to change it), so its result is remembered per path, with the
    ``base_url`` it was joined to: a client whose ``base_url`` is set anew joins again.
    A client class that defines its own ``_prepare_url`` (Azure's deployments, Google
    Cloud's project routes: they read more of the client than ``base_url``) keeps it
    uncached, and so does an SDK without the method: the request is the same either way,
    this only saves the work."""
    defined = next((k for k in type(client).__mro__ if "_prepare_url" in vars(k)), None)
    if defined is None or defined.__module__ not in SDK_BASE_MODULES:
        return
    prepare = vars(defined)["_prepare_url"]
    owner: Callable[[], Any] = weakref.ref(client)  # no cycle through its own attribute
    joined: dict[str, tuple[Any, Any]] = {}

    def prepare_url(url: str) -> Any:
        this = owner()
        base = this.base_url
        found = joined.get(url)
        if found is None or found[0] is not base:
            if len(joined) >= PREPARED_URLS:
                joined.clear()
            found = joined[url] = (base, prepare(this, url))
        return found[1]

    client._prepare_url = prepare_url


def register_header_secrets(headers: Any) -> None:
    """Register (:func:`register_secret`) the value of each of ``headers`` (a provider's
    ``extra_headers`` request option) named like a credential
    (:func:`~runtime.redact.header_secrets`: the token after its scheme, ``Bearer
    <token>``, too; a session's label, no). Why: an AI gateway's key goes in a header of its own
    (``X-Portkey-Api-Key``, ``cf-aig-authorization: Bearer ...``), of no key shape, and
    its 401 quoting it reached the turn's error, the stream, the store and the log."""
    if not isinstance(headers, Mapping):
        return
    register_secrets([s for name, value in headers.items() for s in header_secrets(name, value)])


def client_timeout(timeout: Any, timeout_class: Callable[[Any], Any]) -> Any:
    """``timeout`` (a provider's :attr:`SDKProvider.timeout`) as the SDK client takes it
    for its default: an instance of the SDK's ``Timeout`` class (``timeout_class``), or
    ``None`` (no limit) as it is.

    Why: a request without a timeout of its own builds its ``Timeout`` from the client's
    default (``build_request``: ``Timeout(client.timeout)``), once a call. From a number
    that constructor asks ``isinstance(timeout, SupportsFloat)``, a runtime protocol check
    (``typing``'s ``_ProtocolMeta`` walks the protocol's attributes): ~44,000 of a call's
    instructions (callgrind; a one-delta turn is ~8.5 M, issue 24 goal 1). From a
    ``Timeout`` it copies four fields (~4,300). The request is the same either way: the
    same four timeouts in its extensions, the same ``x-stainless-read-timeout`` header
    (the read timeout's text, ``"60.0"`` both ways)."""
    return None if timeout is None else timeout_class(timeout)


class SDKProvider(Provider):
    """A provider that calls its model through a vendor's SDK client (built lazily)."""

    install_extra: ClassVar[str | None] = None
    """The ``axon-runtime`` extra that installs what the SDK needs beyond the base
    package (``google`` for Gemini): a missing module names it (:meth:`missing_dependency`)."""

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        max_concurrency: int | None = None,
        timeout: float | None = 60.0,
        name: str | None = None,
        foreign_reasoning: ForeignReasoning = "drop",
        request_options: dict[str, Any] | None = None,
        rate_limit: RateLimit | None = None,
        price_as: str | None = None,
        call_timeout: float | None = CALL_TIMEOUT,
        idle_timeout: float | None = IDLE_TIMEOUT,
    ) -> None:
        request_options = dict(request_options or {})
        # Every SDK provider takes ``rate_limit=``, ``call_timeout=`` and
        # ``idle_timeout=``; those that do not name them pass them on among their extra
        # request options (no API has a field of those names).
        rate_limit = rate_limit or request_options.pop("rate_limit", None)
        call_timeout = request_options.pop("call_timeout", call_timeout)
        idle_timeout = request_options.pop("idle_timeout", idle_timeout)
        super().__init__(
            model=model,
            max_concurrency=max_concurrency,
            name=name,
            rate_limit=rate_limit,
            call_timeout=call_timeout,
            idle_timeout=idle_timeout,
        )
        self.base_url = base_url
        """The API root; ``None``: the SDK's default (its :attr:`endpoint_env` variable,
        else the vendor's :attr:`default_endpoint`)."""
        self._api_key = api_key  # private: never logged, never in describe()
        self.timeout = timeout
        """Seconds to connect and between two reads of the stream; ``None``: no limit.
        Keep-alives reset it: :attr:`idle_timeout` and :attr:`call_timeout` (defaults
        :data:`~runtime.provider.IDLE_TIMEOUT`, :data:`~runtime.provider.CALL_TIMEOUT`)
        bound the call where it cannot."""
        self.request_options = dict(request_options or {})
        """Extra arguments of the SDK's ``create`` for every call; a request's
        ``settings`` override them key by key."""
        self.foreign_reasoning = self.check_foreign_reasoning(foreign_reasoning)
        self.price_as = price_as
        self._client: Any = None
        self._create_params: frozenset[str] | None = None

    def new_client(self) -> Any:
        """A new client of the SDK, with its retries off (imports the SDK). Raise
        :func:`~actors.providers.failures.missing_key` when no key is given or found."""
        raise NotImplementedError

    def client_secrets(self, client: Any) -> Iterable[str | None]:
        """The credentials ``client`` resolved (given, or read from the environment)."""
        return (client.api_key,)

    def _get_client(self) -> Any:
        """The SDK client, built on first use; its credentials (its key, those of its
        base URL) are then secrets, which :mod:`runtime.redact` removes from every error
        and log line (its HTTP client's request lines have their URLs redacted from the
        import of :mod:`runtime.logging` on: :func:`~runtime.logging.quiet_http_client_logs`)."""
        if self._client is None:
            try:
                self._client = self.new_client()
            except ImportError as exc:  # the SDK, or a module of an extra it needs
                missing = self.missing_dependency(exc)
                if missing is None:
                    raise
                raise missing from exc
            self.prepare_client(self._client)
            for secret in self.client_secrets(self._client):
                register_secret(secret)
            # A base URL's own credentials (``https://user:PW@proxy/v1``, ``?api-key=``)
            # are secrets too: a server's error that echoes them went to the user's
            # stream, the stored message and the log as it was.
            for url in (self.base_url, getattr(self._client, "base_url", None)):
                if url is not None:
                    register_url_secrets(str(url))
            register_header_secrets(self.request_options.get("extra_headers"))
        return self._client

    def call_options(self, settings: Mapping[str, Any]) -> dict[str, Any]:
        """A call's options: its ``settings`` (the agent's, the call's own) over the
        provider's :attr:`request_options`. A call's own ``extra_headers`` are registered
        as the provider's are (:func:`register_header_secrets`): an agent's gateway key
        quoted by a 401 reached the turn's error as the provider's did. One key's probe
        for a call that has none."""
        if "extra_headers" in settings:
            register_header_secrets(settings["extra_headers"])
        return {**self.request_options, **settings}

    def missing_dependency(self, exc: BaseException) -> errors.ConfigurationError | None:
        """``exc`` as the one line a user can act on, when it (or what caused it: the
        SDKs wrap their own ``ImportError``) says a module of :attr:`install_extra` is not
        installed; ``None`` otherwise, or for a provider of the base package alone."""
        seen: BaseException | None = exc
        for _ in range(4):  # the SDK's error, the ImportError it wraps: a short chain
            if seen is None or self.install_extra is None:
                return None
            if isinstance(seen, ImportError):
                return errors.ConfigurationError(
                    f"the {self.provider_name} provider needs the module "
                    f"{seen.name or 'of its SDK'}, which is not installed: "
                    f"pip install 'axon-runtime[{self.install_extra}]'"
                )
            seen = seen.__cause__ or seen.__context__
        return None

    def prepare_client(self, client: Any) -> None:
        """Make a new client cheaper to call, once, where it is built (the request it
        sends stays the same): its endpoints' URLs joined once (:func:`cache_prepared_urls`);
        and safer: a redirect off its ``base_url``'s origin refused
        (:class:`~actors.providers.failures.StayHome`, on the SDK's HTTP client)."""
        cache_prepared_urls(client)
        base_url = getattr(client, "base_url", None)
        if base_url is not None and hasattr(base_url, "scheme"):
            stay_home(getattr(client, "_client", None), base_url, self.provider_name)

    def _known_params(self, create: Callable[..., Any]) -> frozenset[str]:
        """The argument names of the SDK's ``create`` (read once): an option it does not
        name goes in ``extra_body``, so new API fields work without an SDK upgrade."""
        if self._create_params is None:
            self._create_params = frozenset(inspect.signature(create).parameters)
        return self._create_params

    async def aclose(self) -> None:
        """Close the HTTP client (its connection pool), if one was built; the next call
        builds a new one."""
        client, self._client = self._client, None
        if client is not None:
            await client.close()


__all__ = ["SDKProvider", "cache_prepared_urls", "client_timeout"]
