"""The failure plumbing every HTTP provider shares (actors/providers/failures.py).

One ``retry_after``, one status ladder and one transport classification: the same
failure is the same error class whichever SDK reported it, and no provider imports an
HTTP library that the project does not declare.
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

import anthropic
import httpx
import httpx2
import openai
import pytest
from hypothesis import given
from hypothesis import strategies as st
from packaging.requirements import Requirement

from actors.providers import anthropic as anthropic_provider
from actors.providers import gemini as gemini_provider
from actors.providers import openai as openai_provider
from actors.providers.failures import classify_status, classify_transport, retry_after
from runtime import errors

ROOT = Path(__file__).resolve().parents[1]


# -- retry_after --------------------------------------------------------------------------


def test_retry_after_ms_wins_over_retry_after():
    assert retry_after({"retry-after-ms": "1500", "retry-after": "9"}) == 1.5


def test_retry_after_in_seconds():
    assert retry_after({"retry-after": "7"}) == 7.0


def test_retry_after_as_a_past_http_date_is_zero():
    assert retry_after({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}) == 0.0


def test_retry_after_as_a_future_http_date_is_positive():
    assert retry_after({"retry-after": "Tue, 01 Jan 2999 00:00:00 GMT"}) > 0


@pytest.mark.parametrize("value", ["soon", "inf", "nan", "1e999", ""])
def test_a_malformed_or_endless_retry_after_counts_as_absent(value):
    assert retry_after({"retry-after": value}) is None
    assert retry_after({"retry-after-ms": value}) is None


def test_no_headers_or_no_retry_header_is_none():
    assert retry_after(None) is None
    assert retry_after({}) is None


def test_a_negative_wait_is_zero():
    assert retry_after({"retry-after": "-3"}) == 0.0


@given(st.dictionaries(st.sampled_from(["retry-after", "retry-after-ms"]), st.text()))
def test_any_header_text_gives_none_or_a_wait_never_an_exception(headers):
    value = retry_after(headers)
    assert value is None or 0 <= value < float("inf")


# -- the status ladder ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "error_type", "code", "expected"),
    [
        (429, None, None, errors.RateLimited),
        (None, "rate_limit_error", None, errors.RateLimited),
        (529, None, None, errors.Overloaded),
        (None, "overloaded_error", None, errors.Overloaded),
        (500, None, None, errors.ProviderUnavailable),
        (503, None, None, errors.ProviderUnavailable),
        (None, "server_error", None, errors.ProviderUnavailable),
        (401, None, None, errors.AuthenticationFailed),
        (403, None, None, errors.AuthenticationFailed),
        (None, "authentication_error", None, errors.AuthenticationFailed),
        (408, None, None, errors.ProviderTimeout),
        (400, None, "context_length_exceeded", errors.ContextTooLong),
        (400, None, None, errors.BadRequest),
        (404, None, None, errors.BadRequest),
        (None, "invalid_request_error", None, errors.BadRequest),
        (None, None, None, errors.ProviderError),
    ],
)
def test_the_ladder_maps_status_and_body_words_to_one_class(status, error_type, code, expected):
    err = classify_status("boom", provider="p", status=status, error_type=error_type, code=code)
    assert type(err) is expected
    assert err.status_code == status and err.provider == "p" and err.message == "boom"


def test_rate_limit_is_checked_before_overloaded():
    err = classify_status("x", provider="p", status=429, error_type="overloaded_error")
    assert isinstance(err, errors.RateLimited)


def test_insufficient_quota_is_a_rate_limit_that_waiting_cannot_fix():
    err = classify_status("x", provider="p", status=429, code="insufficient_quota")
    assert isinstance(err, errors.RateLimited) and not err.retryable


@pytest.mark.parametrize(
    "message",
    [
        "prompt is too long: 210000 tokens > 200000 maximum",
        "This model's maximum context length is 8192 tokens",
        "input exceeds the context window",
        "The input token count (1048577) exceeds the maximum number of tokens allowed (1048576).",
        "Input is too long for requested model.",
    ],
)
def test_a_400_saying_the_context_is_too_long_is_context_too_long(message):
    assert isinstance(classify_status(message, provider="p", status=400), errors.ContextTooLong)


def test_a_server_error_mentioning_context_stays_retryable():
    err = classify_status("context window service down", provider="p", status=503)
    assert isinstance(err, errors.ProviderUnavailable) and err.retryable


def test_retry_after_is_kept_on_the_error():
    err = classify_status("slow down", provider="p", status=429, retry_after=2.5)
    assert err.retry_after == 2.5


# -- both SDKs classify the same HTTP failure the same way ----------------------------------


def _openai_error(status: int, message: str, headers: dict[str, str]) -> BaseException:
    request = httpx2.Request("POST", "http://127.0.0.1/v1/chat/completions")
    response = httpx2.Response(status, headers=headers, request=request)
    return openai.APIStatusError(message, response=response, body={"message": message})


@pytest.mark.parametrize("status", ["²", "٤٠٠", True])
def test_an_in_stream_error_with_an_odd_status_in_its_body_is_still_classified(status):
    # A server's error body is data: a superscript or Arabic-Indic "status" (isdigit()
    # but not int()), or a boolean, must give a classified error, not crash the mapping.
    request = httpx2.Request("POST", "http://127.0.0.1/v1/chat/completions")
    error = openai.APIError("boom", request, body={"status_code": status})
    assert isinstance(openai_provider.classify_error(error), errors.AxonError)


def _anthropic_error(status: int, message: str, headers: dict[str, str]) -> BaseException:
    request = httpx2.Request("POST", "http://127.0.0.1/v1/messages")
    response = httpx2.Response(status, headers=headers, request=request)
    return anthropic.APIStatusError(message, response=response, body={"message": message})


@pytest.mark.parametrize("status", [400, 401, 403, 404, 408, 413, 422, 429, 500, 502, 503, 529])
def test_openai_and_anthropic_give_the_same_class_for_the_same_status(status):
    headers = {"retry-after": "3"}
    from_openai = openai_provider.classify_error(_openai_error(status, "failed", headers))
    from_anthropic = anthropic_provider.classify_error(_anthropic_error(status, "failed", headers))
    assert type(from_openai) is type(from_anthropic)
    assert from_openai.status_code == from_anthropic.status_code == status
    assert from_openai.retry_after == from_anthropic.retry_after == 3.0
    assert (from_openai.provider, from_anthropic.provider) == ("openai", "anthropic")


def _gemini_error(status: int, message: str, headers: dict[str, str]) -> BaseException:
    from google.genai import errors as genai_errors

    request = httpx2.Request("POST", "http://127.0.0.1/v1/models/m:streamGenerateContent")
    response = httpx2.Response(status, headers=headers, request=request)
    body = {"error": {"code": status, "message": message, "status": "SOME_STATUS"}}
    return genai_errors.APIError(status, body, response)


@pytest.mark.parametrize("status", [400, 401, 403, 404, 408, 413, 422, 429, 500, 502, 503, 529])
def test_gemini_gives_the_same_class_as_the_others_for_the_same_status(status):
    headers = {"retry-after": "3"}
    from_openai = openai_provider.classify_error(_openai_error(status, "failed", headers))
    from_gemini = gemini_provider.classify_error(_gemini_error(status, "failed", headers))
    assert type(from_gemini) is type(from_openai)
    assert (from_gemini.status_code, from_gemini.retry_after) == (status, 3.0)
    assert from_gemini.provider == "google"


def test_both_sdks_read_context_too_long_from_the_message():
    message = "prompt is too long: 210000 tokens > 200000 maximum"
    assert isinstance(
        openai_provider.classify_error(_openai_error(400, message, {})), errors.ContextTooLong
    )
    assert isinstance(
        anthropic_provider.classify_error(_anthropic_error(400, message, {})),
        errors.ContextTooLong,
    )


# -- transport failures ---------------------------------------------------------------------


@pytest.mark.parametrize("http", [httpx, httpx2], ids=["httpx", "httpx2"])
@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (lambda h: h.ReadTimeout("slow"), errors.ProviderTimeout),
        (lambda h: h.ConnectTimeout("slow"), errors.ProviderTimeout),
        (lambda h: h.ReadError("reset"), errors.ConnectionLost),
        (lambda h: h.RemoteProtocolError("cut mid-body"), errors.ConnectionLost),
        (lambda h: h.ConnectError("refused"), errors.ConnectionLost),
        (lambda h: h.DecodingError("bad gzip"), errors.MalformedStream),
    ],
)
def test_errors_of_either_http_library_are_classified(http, make, expected):
    err = classify_transport(make(http), provider="p")
    assert type(err) is expected and err.provider == "p" and err.retryable


def test_undecodable_json_is_malformed():
    import json

    err = classify_transport(json.JSONDecodeError("bad", "{", 1), provider="p")
    assert isinstance(err, errors.MalformedStream)


def test_anything_else_is_left_to_the_provider():
    assert classify_transport(RuntimeError("boom"), provider="p") is None


@pytest.mark.parametrize(
    "module",
    [openai_provider, anthropic_provider, gemini_provider],
    ids=["openai", "anthropic", "google"],
)
def test_providers_report_an_unknown_exception_with_its_type(module):
    err = module.classify_error(RuntimeError("boom"))
    assert type(err) is errors.ProviderError and "RuntimeError: boom" in str(err)


# -- what the project imports, it declares --------------------------------------------------


def _third_party_imports() -> dict[str, str]:
    """Top-level module -> first file importing it, for runtime/ and actors/."""
    found: dict[str, str] = {}
    for path in sorted([*ROOT.glob("runtime/**/*.py"), *ROOT.glob("actors/**/*.py")]):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top in sys.stdlib_module_names or top in ("runtime", "actors", "__future__"):
                    continue
                found.setdefault(top, str(path.relative_to(ROOT)))
    return found


def test_every_library_the_code_imports_is_a_declared_dependency():
    """Declared means a dependency or in an extra (an opt-in plug-in imports its library
    lazily, and says which extra to install when it is missing)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    specs = [*project["dependencies"]]
    for extra in project.get("optional-dependencies", {}).values():
        specs.extend(extra)
    declared = {
        re.split(r"[<>=!~\[ ;]", spec, maxsplit=1)[0].lower().replace("_", "-") for spec in specs
    }
    distributions = importlib.metadata.packages_distributions()
    undeclared = {
        module: where
        for module, where in _third_party_imports().items()
        if not {d.lower().replace("_", "-") for d in distributions.get(module, [module])} & declared
    }
    assert undeclared == {}, f"imported but not in pyproject dependencies: {undeclared}"


def test_every_installed_dependency_is_within_its_declared_range():
    """``pip install -e .`` keeps an installed release that satisfies a range, so the
    minimums in pyproject.toml are the releases the provider tests were seen to pass with
    (its comments say which); an environment holding an older one than declared is not
    the one these tests vouch for."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    specs = [*project["dependencies"]]
    for extra in project.get("optional-dependencies", {}).values():
        specs.extend(extra)
    outside = {}
    for spec in specs:
        requirement = Requirement(spec)
        if requirement.name == project["name"] or not requirement.specifier:
            continue
        try:
            installed = importlib.metadata.version(requirement.name)
        except importlib.metadata.PackageNotFoundError:
            continue  # an extra that is not installed here
        if not requirement.specifier.contains(installed, prereleases=True):
            outside[spec] = installed
    assert outside == {}, f"installed releases outside pyproject's ranges: {outside}"


def test_no_provider_imports_the_sdks_http_library_directly():
    """The SDKs are built on ``httpx`` or ``httpx2`` depending on their version: a provider
    that imported one would classify the other's transport errors wrongly."""
    importers = []
    for path in sorted(ROOT.glob("actors/providers/**/*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            if any(name.split(".")[0] in ("httpx", "httpx2") for name in names):
                importers.append(f"{path.name}:{node.lineno}")
    assert importers == []
