"""Every Python example in docs/ runs as written."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = [
    (path.name, i, block)
    for path in sorted((ROOT / "docs").glob("*.md"))
    for i, block in enumerate(re.findall(r"```python\n(.*?)```", path.read_text(), re.S))
]
# An example followed by "prints:" (or "It prints (...):") and a fenced block: that block
# is what the reader is told to expect, so it must be the whole output, not a part of it.
DOCUMENTED_OUTPUT = {
    (path.name, i): shown.group(1)
    for path in sorted((ROOT / "docs").glob("*.md"))
    for i, after in enumerate(re.split(r"```python\n.*?```\n", path.read_text(), flags=re.S)[1:])
    if (shown := re.match(r"\s*(?:It prints|prints)[^\n]*\n\s*```[a-z]*\n(.*?)```", after, re.S))
}

EXPECTED = {
    ("embedding.md", 0): "Paris is the capital of France. | stop 17 tokens\n"
    "Paris is the capital of France.\n",
    ("embedding.md", 1): "budget max_steps 3\n{'temperature': 0.2, 'max_completion_tokens': 500}",
    ("embedding.md", 2): "{} ['book']",
    ("embedding.md", 3): "Your name is Ada. ['user', 'assistant', 'user', 'assistant']",
    ("embedding.md", 4): "20 sessions answered 5",
    ("embedding.md", 5): "100 answered",
    ("embedding.md", 6): "start ... finish",
    ("embedding.md", 7): "tool charge raised RuntimeError: billing refused 5 EUR for token "
    "[redacted]\n",
    ("embedding.md", 8): "evicted: True\n['user', 'assistant', 'user', 'assistant']",
    ("embedding.md", 9): "['You ', 'said', ': he', 'llo'] True",
    ("actors.md", 0): "1 turn, 11 tokens",  # read after the block: the drain delivered all
    ("actors.md", 1): "the tool call was denied: emails need a human",
    ("actors.md", 2): "finished: stop 1 step\n"
    "unknown plug-in 'turns'; registered plug-ins: otel, recorder\n",
    ("approval.md", 0): "awaiting-input send_email {'to': 'ceo@example.com'}\n"
    "stop Done: it is sent. True",
    ("approval.md", 1): "{'to': 'cfo@example.com'} {'to': 'ceo@example.com'} "
    "sent to cfo@example.com\n",
    ("busy.md", 0): "steered: True\n['user', 'assistant', 'tool', 'user', 'assistant']\n"
    "3 flights (flights to Oslo), of which I keep those in June.\n",
    ("mcp.md", 0): "add_note -> saved: buy milk (1 notes)\nNoted.",
    ("providers.md", 0): "hello there actors 3",
    ("media.md", 0): "What is this? ['image/png', 'application/pdf']\n"
    "['text', 'image_url', 'file']\n['text', 'image', 'document']\n"
    "refused: image (image/png) is 2.0 KiB; the limit is 1.0 KiB per image | stored messages: 2\n",
    ("providers.md", 1): "",  # the kits' examples define test classes: they run, silently
    ("providers.md", 2): "",
    ("providers.md", 3): "{'store': False, 'encrypted_reasoning': True, "
    "'foreign_reasoning': 'drop'}\n"
    "user -\nreasoning rs_1\nmessage msg_1\n",
    ("providers.md", 4): "('google', 'gemini-2.5-flash')\n('openai', 'llama3:8b')\n"
    "anthropic-bedrock:anthropic.claude-sonnet-4-5-20250929-v1:0\n"
    "['text', 'thought']\n['function_call', 'thought_signature']\n",
    ("providers.md", 5): "17 messages stored, 1 summaries\n"
    "The user asked numbered questions; each got a long answer.\n",
    ("providers.md", 6): "scripted|scripted|- 500\n",
    ("structured-output.md", 0): "Weather(city='Paris', temp=21.5)\n2 steps",
    ("web.md", 0): "support",
    ("protocols-openai.md", 0): "scripted: Let me check the weather. It is 22°C and clear skies "
    "in Oslo right now. (78 tokens)\nthought: The user asks about the weather in Oslo. ...\n"
    "Let me check the weather. It is 26°C and windy in Paris right now. stop\n",
    ("protocols-ag-ui.md", 0): "2 steps, tools ['get_weather']: Let me check the weather. "
    "It is 22°C and clear skies in Oslo right now.\nRUN_FINISHED success 78 tokens\n"
    "['RUN_STARTED', 'MESSAGES_SNAPSHOT', 'RUN_FINISHED']\n"
    "['user', 'reasoning', 'reasoning', 'assistant', 'tool']\n",
    ("protocols-a2a.md", 0): "Let me check the weather. It is 22°C and clear skies in Oslo "
    "right now.\n"
    "TASK_STATE_COMPLETED demo-1\n"
    "scripted said: Let me check the weather. It is 26°C and windy in Paris right now.\n"
    "Asked it.\n",
    ("protocols-mcp.md", 0): "scripted: Let me check the weather. It is 22°C and clear skies "
    "in Oslo right now. (17 progress notifications)\nsame session: True\n"
    "stdio: Let me check the weather. It is 26°C and windy in Paris right now.\n",
    ("protocols-mcp.md", 1): "scripted -> Let me check the weather. It is 22°C and clear skies in "
    "Oslo right now.\nDone.\n",
    ("asyncio.md", 0): "6 deltas: Paris is the capital of France. | stop\n"
    "Paris is the capital of France. ['user', 'assistant', 'user', 'assistant']\n",
    ("asyncio.md", 1): '3 text events, then event: done | data: "stop"\n',
    ("telemetry.md", 0): "invoke_agent weather\n  chat scripted\n  execute_tool get_weather\n"
    "  chat scripted\n",
}


def test_the_outputs_shown_in_the_docs_are_found():
    """The pattern finds the examples whose whole output the docs show (a typo in the
    lead-in would silently drop one from the exact check below)."""
    assert sorted(DOCUMENTED_OUTPUT) == [
        ("media.md", 0),
        ("protocols-a2a.md", 0),
        ("protocols-ag-ui.md", 0),
        ("protocols-mcp.md", 0),
        ("protocols-openai.md", 0),
        ("telemetry.md", 0),
    ]


def test_every_example_has_an_expected_output():
    assert {(name, i) for name, i, _ in EXAMPLES} == set(EXPECTED)


@pytest.mark.parametrize(
    ("name", "index", "code"), EXAMPLES, ids=[f"{n}#{i}" for n, i, _ in EXAMPLES]
)
def test_doc_example_runs(name, index, code):
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stderr
    assert EXPECTED[(name, index)] in proc.stdout
    if (name, index) in DOCUMENTED_OUTPUT:
        assert proc.stdout == DOCUMENTED_OUTPUT[(name, index)]


def test_the_stream_table_names_every_chunk_type_and_its_fields():
    """docs/streaming.md's table is hand-written: a chunk type or field added to
    runtime/output.py must be added there too."""
    import attrs

    from runtime.output import OUTPUT_CHUNK_TYPES

    rows: dict[str, set[str]] = {}
    for line in (ROOT / "docs" / "streaming.md").read_text().splitlines():
        row = re.match(r"\| (`[a-z-]+`(?: / `[a-z-]+`)*) \| (.*) \|$", line)
        if row:
            for name in re.findall(r"`([a-z-]+)`", row.group(1)):
                rows[name] = set(re.findall(r"`([a-z_]+)`", row.group(2)))
    common = {"seq", "session_id", "turn_id", "type"}  # said once, above the table
    found = {cls.type: {f.name for f in attrs.fields(cls)} - common for cls in OUTPUT_CHUNK_TYPES}
    assert set(rows) == set(found)
    assert {t: fields - rows[t] for t, fields in found.items() if fields - rows[t]} == {}


def test_every_variable_the_tests_read_is_documented():
    """docs/testing.md promises every variable the tests read (the runtime's own, and the
    benchmarks', are documented where they are used)."""
    read = set()
    for path in (ROOT / "tests").rglob("*.py"):
        read |= set(re.findall(r"AXON_[A-Z0-9_]+[A-Z0-9]", path.read_text()))
    documented = (ROOT / "docs" / "testing.md").read_text()
    elsewhere = "".join(p.read_text() for p in (ROOT / "docs").glob("*.md"))
    elsewhere += (ROOT / "benchmarks" / "README.md").read_text()
    missing = {v for v in read if v not in documented and v not in elsewhere}
    assert missing == set()


def test_the_approval_pages_command_line_example_runs_where_it_says(tmp_path):
    """Its agent is one of the tests' (tests/support/approval_agents.py), found only from
    the repository's root: pasted anywhere else it was "No module named 'tests'", with
    nothing in the block saying where to run it."""
    text = (ROOT / "docs" / "approval.md").read_text()
    (block,) = [b for b in re.findall(r"```sh\n(.*?)```", text, re.S) if "approval_agents" in b]
    assert "in the repository's root" in block
    db = str(tmp_path / "s.db")
    script = block.replace("python -m", f"{sys.executable} -m").replace(" s.db ", f" {db} ")
    lines = [line for line in script.splitlines() if line and not line.startswith("#")]
    assign, first, second = lines
    waits = subprocess.run(
        ["bash", "-c", f"{assign}\n{first}"], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert waits.returncode == 3, waits.stderr
    assert waits.stderr.startswith('the turn waits for approval: get_weather({"city": "Oslo"})')
    goes_on = subprocess.run(
        ["bash", "-c", f"{assign}\n{second}"], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert goes_on.returncode == 0, goes_on.stderr
    assert "It is sunny in Oslo." in goes_on.stdout


def test_the_workers_liveness_probe_passes_on_a_fresh_health_file_only(tmp_path):
    """docs/deployment.md's Kubernetes probe for a worker, run by ``sh`` (dash here, as
    the probe's ``exec`` runs it) against a real file: a file just touched passes, one
    40 s old and a missing one (the worker exited, or never touched it) fail."""
    text = (ROOT / "docs" / "deployment.md").read_text()
    (command,) = re.findall(r"command: \[sh, -c, '(.*)'\]", text)
    assert "/tmp/axon-alive" in command
    alive = tmp_path / "axon-alive"
    probe = command.replace("/tmp/axon-alive", str(alive))

    def passes() -> bool:
        return subprocess.run(["sh", "-c", probe], capture_output=True, timeout=10).returncode == 0

    alive.touch()
    assert passes()
    stale = time.time() - 40
    os.utime(alive, (stale, stale))
    assert not passes()
    alive.unlink()
    assert not passes()


@pytest.mark.parametrize("command", ["serve", "worker"])
def test_every_option_of_the_servers_is_named_in_the_docs(command):
    """An option added to ``serve`` or ``worker`` (``--drain``, ``--health-file``,
    ``--max-connections-per-address``) is looked for in the docs by an operator: each
    of its options is named on some page."""
    import argparse

    from runtime.app.web.serve import add_serve_parser
    from runtime.app.worker import add_worker_parser

    add = {"serve": add_serve_parser, "worker": add_worker_parser}[command]
    parser = add(argparse.ArgumentParser().add_subparsers())
    options = {o for a in parser._actions for o in a.option_strings if o.startswith("--")}
    assert "--drain" in options or "--health-file" in options
    docs = "".join(p.read_text() for p in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
    named = set(re.findall(r"(?<![\w-])(--[a-z][a-z-]*[a-z])(?![\w-])", docs))
    assert sorted(options - named - {"--help"}) == []


def test_every_serve_option_is_in_web_md_s_list_of_options():
    """docs/web.md's ``Options:`` paragraph is where an operator of ``serve`` looks
    (``--call-timeout``, ``--redis-prefix``, ``--run-turns-here`` were named only on
    other pages): each ``serve`` option is named there."""
    import argparse

    from runtime.app.web.serve import add_serve_parser

    parser = add_serve_parser(argparse.ArgumentParser().add_subparsers())
    options = {o for a in parser._actions for o in a.option_strings if o.startswith("--")}
    page = (ROOT / "docs" / "web.md").read_text()
    listed = page[page.index("\nOptions: ") : page.index("SIGINT/SIGTERM stop it")]
    named = set(re.findall(r"(?<![\w-])(--[a-z][a-z-]*[a-z])(?![\w-])", listed))
    assert sorted(options - named - {"--help"}) == []
