"""Every relative link in README.md and docs/*.md reaches a file that exists, and every
``#anchor`` in one names a heading of its target (as GitHub makes anchors of headings):
files move and headings change, and a link that no longer resolves is found here. The
README links every page, and the versioned names the pages give the store's server-side
functions are the store's own."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"```.*?```", re.S)
LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchors(page: Path) -> set[str]:
    """The anchors GitHub gives ``page``'s headings: lower case, punctuation but ``-`` and
    ``_`` dropped, spaces as ``-``; a repeated one gets ``-1``, ``-2``, ..."""
    found: set[str] = set()
    counts: dict[str, int] = {}
    for heading in re.findall(r"^#{1,6} (.+)$", FENCE.sub("", page.read_text()), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        n = counts.get(slug, 0)
        counts[slug] = n + 1
        found.add(slug if n == 0 else f"{slug}-{n}")
    return found


def broken_links(page: Path) -> list[str]:
    broken = []
    for target in LINK.findall(FENCE.sub("", page.read_text())):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no such heading")
    return broken


def test_the_anchors_are_githubs(tmp_path):
    page = ROOT / "docs" / "deployment.md"
    assert "guarantees-and-how-they-are-kept" in anchors(page)
    assert "worker-deployments" in anchors(ROOT / "docs" / "protocols-mcp.md")
    repeated = tmp_path / "repeated.md"  # no page repeats a heading since protocols.md split
    repeated.write_text("## Errors\n### Errors\n```sh\n# Errors\n```\n## Errors\n")
    assert anchors(repeated) == {"errors", "errors-1", "errors-2"}


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_every_relative_link_resolves(page):
    assert broken_links(page) == []


BENCHMARK_PAGES = [
    ROOT / "benchmarks" / "README.md",
    *sorted((ROOT / "benchmarks" / "journal").glob("*.md")),
]


@pytest.mark.parametrize("page", BENCHMARK_PAGES, ids=lambda page: page.name)
def test_every_relative_link_of_the_benchmarks_pages_resolves(page):
    """The benchmarks' README and its journal link the docs and each other (the journal
    moved out of the README one folder down: a link that did not follow is found here)."""
    assert broken_links(page) == []


def test_the_readme_links_every_page_of_docs():
    """A page nobody links is a page nobody finds (docs/relay.md was missing)."""
    linked = {
        (ROOT / target.partition("#")[0]).resolve()
        for target in LINK.findall((ROOT / "README.md").read_text())
    }
    assert [page.name for page in PAGES[1:] if page.resolve() not in linked] == []


def test_the_server_side_functions_the_docs_name_are_the_stores():
    """The PostgreSQL store's functions carry a version in their name, bumped when they
    change (axon_save_v2 became v3); a page naming an old one sends a reader to the wrong
    function. Read from the module's text, so psycopg need not be installed."""
    source = (ROOT / "actors" / "stores" / "postgres_calls.py").read_text()
    current = set(re.findall(r'_FUNCTION_NAME: Final = "(axon_\w+)"', source))
    named = {
        name
        for page in PAGES
        for name in re.findall(
            r"\baxon_(?:claim|save|save_next|decide|submit)_v\d+\b", page.read_text()
        )
    }
    assert current and named - current == set()


def test_every_pip_install_of_an_extra_is_quoted():
    """``pip install axon-runtime[tokens]`` unquoted is a glob in zsh (macOS's shell):
    "no matches found", and nothing installed. Every other page quoted it."""
    unquoted = re.compile(r"pip install (?:-e )?[^'\"`\s]*\[[a-z,]+\]")
    found = [f"{page.name}: {hit}" for page in PAGES for hit in unquoted.findall(page.read_text())]
    assert found == []
