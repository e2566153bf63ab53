"""Render a turn's output stream in a terminal with ``rich``.

Reasoning is shown dimmed, text is typed as it streams, and every tool call gets a
card with its input and its result (or error). Rendering reacts to chunk types only,
so it works for any provider.

Whatever a model, a tool or a stored session says is shown through
:func:`terminal_text`: its control characters (an escape sequence that clears the screen,
sets the window title or recolours the prompt) and bidirectional overrides are printed as
visible ``\\x1b``-style escapes, never obeyed by the user's terminal.
"""

from __future__ import annotations

import errno
import json
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.panel import Panel
from rich.text import Text

from runtime.chunks import Usage


def _escapes() -> dict[int, str]:
    # C0 controls but the tab and the newline, DEL and C1 (U+009B is a one-character
    # CSI). Rich drops BEL, BS, VT, FF and CR itself (so a CRLF still ends one line).
    codes = [*range(0x00, 0x07), *range(0x0E, 0x20), *range(0x7F, 0xA0)]
    table = {c: f"\\x{c:02x}" for c in codes}
    # Embeddings, overrides and isolates: they reorder what follows on the line, so a
    # tool's arguments could read as other arguments at the approval prompt.
    table.update({c: f"\\u{c:04x}" for c in (*range(0x202A, 0x202F), *range(0x2066, 0x206A))})
    # Marks (LRM, RLM, ALM) reorder too; the line and paragraph separators (U+2028,
    # U+2029) end a line on some terminals and read as nothing on others: a stored text
    # could look like two lines, or one line hide where another began (``show``).
    table.update({c: f"\\u{c:04x}" for c in (0x200E, 0x200F, 0x061C, 0x2028, 0x2029)})
    # Lone surrogates (half an emoji a provider split across two deltas, a file name
    # decoded with ``surrogateescape``): no encoding can write them, so printing one
    # raised UnicodeEncodeError and ended ``run`` in a traceback.
    table.update({c: f"\\u{c:04x}" for c in range(0xD800, 0xE000)})
    return table


_ESCAPES = _escapes()


def terminal_text(text: str) -> str:
    """``text`` as a terminal may print it: every control character (but the tab and the
    newline) and every bidirectional override written as a visible escape (``\\x1b``,
    ``\\u202e``), so a model's output cannot drive the user's terminal."""
    return text.translate(_ESCAPES)


_LINE_ESCAPES = {**_ESCAPES, **{c: f"\\x{c:02x}" for c in range(0x07, 0x0E)}}


def terminal_line(text: str) -> str:
    """:func:`terminal_text` for a line written without rich (a listing's field, a
    prompt, a line on stderr): BEL, BS, the tab, VT, FF, CR and the newline escaped too. Rich
    drops the first five itself; a plain write passed them, so a CR or a backspace in a
    stored agent's name wrote over the line before it, a BEL rang, and a newline made a
    line of its own (another session, in ``sessions``' listing), a tab another column."""
    return text.translate(_LINE_ESCAPES)


NARROW = 16
"""Columns under which a tool card is printed without its box: at four columns or fewer
the box's borders and padding left its input and result no room, and they vanished."""


class _Console(Console):
    """rich's ``Console`` whose stdout reader leaving is the ``BrokenPipeError`` itself:
    rich's own exits with ``SystemExit(1)``, so ``axon run ... | head -1`` ended with
    status 1 and its turn aborted as ``consumer failed: SystemExit``, where ``--jsonl``
    (whose writes raise it) ends with 0 (``runtime.app.cli``)."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        raise BrokenPipeError(errno.EPIPE, "the reader of stdout left")


class TerminalRenderer:
    """Feed it :data:`~runtime.output.OutputChunk` s with :meth:`render`."""

    def __init__(self, console: Console | None = None) -> None:
        self.console = console or _Console(highlight=False)
        self._inputs: dict[str, Any] = {}
        self._names: dict[str, str] = {}
        self._at_line_start = True

    def _newline(self) -> None:
        if not self._at_line_start:
            self.console.print()
            self._at_line_start = True

    def know_calls(self, calls: Any) -> None:
        """Remember the name and input of tool calls rendered before this renderer ran
        (a waiting turn resumed by another process), so their result cards show them."""
        for call in calls:
            self._inputs[call.tool_call_id] = call.input
            self._names[call.tool_call_id] = call.tool_name

    def end_line(self) -> None:
        """End the line being written, if any (before a message that is not output)."""
        self._newline()

    def _write(self, text: str, style: str | None = None) -> None:
        if text:
            safe = terminal_text(text)
            self.console.print(Text(safe, style=style or ""), end="", soft_wrap=True)
            self._at_line_start = text.endswith("\n")

    def render(self, chunk: Any) -> None:
        """Show one chunk (by its ``type``: :data:`_RENDER`); other chunks show nothing."""
        render = _RENDER.get(chunk.type)
        if render is not None:
            render(self, chunk)

    def _end_part(self, chunk: Any) -> None:
        self._newline()

    def _reasoning_start(self, chunk: Any) -> None:
        self._newline()
        self._write("thinking: ", "dim bold")

    def _reasoning_delta(self, chunk: Any) -> None:
        self._write(chunk.text, "dim italic")

    def _text_delta(self, chunk: Any) -> None:
        self._write(chunk.text)

    def _tool_input_start(self, chunk: Any) -> None:
        self._newline()
        self._names[chunk.tool_call_id] = chunk.tool_name
        self._write(f"→ calling {chunk.tool_name}…\n", "cyan")

    def _tool_call(self, chunk: Any) -> None:
        self._inputs[chunk.tool_call_id] = chunk.input
        self._names[chunk.tool_call_id] = chunk.tool_name

    def _tool_outcome(self, chunk: Any) -> None:
        """A call's card: its input, and its result (green) or error (red)."""
        self._newline()
        args = json.dumps(self._inputs.get(chunk.tool_call_id, {}), ensure_ascii=False)
        if chunk.type == "tool-result":
            label, value, border = ("result ", "bold green"), _fmt(chunk.output), "green"
        else:
            label, value, border = ("error  ", "bold red"), chunk.error, "red"
        body = Text.assemble(
            ("input  ", "bold"), terminal_text(args), "\n", label, terminal_text(value)
        )
        title = terminal_text(f"tool · {chunk.tool_name}")
        if self.console.width < NARROW:  # a box would leave its content no room at all
            self.console.print(Text.assemble((title, border), "\n", body), soft_wrap=True)
            return
        # A str title is read as rich markup: a tool name "[link=URL]x[/link]" (the
        # model's, for a tool it made up) became a hyperlink to its site. Text is text.
        self.console.print(
            Panel(body, title=Text(title), title_align="left", border_style=border, expand=False)
        )

    def _approval_request(self, chunk: Any) -> None:
        self._newline()
        self._write(f"⏸ {chunk.tool_name} waits for approval ({chunk.approval_id})\n", "yellow")

    def _output_denied(self, chunk: Any) -> None:
        self._newline()
        self._write(f"✗ {chunk.tool_name} denied: {chunk.reason or 'no reason'}\n", "red")

    def _reset_step(self, chunk: Any) -> None:
        """A terminal cannot take printed text back: the reset is said where it happens,
        and what follows is the step as it is stored."""
        self._newline()
        e = chunk.error
        self.console.print(
            Text(
                terminal_text(
                    f"↺ {e.kind}: step {chunk.step} starts over on {chunk.provider} "
                    "(disregard its output above)"
                ),
                style="yellow",
            ),
            soft_wrap=True,
        )

    def _finish(self, chunk: Any) -> None:
        self._newline()
        u = chunk.usage
        cost = "" if u.cost is None else f" · {format_cost(u.cost)}"
        self.console.print(
            Text(
                f"[{chunk.finish_reason} · {u.input_tokens} in / {u.output_tokens} out tokens"
                f"{cost}]",
                style="dim",
            ),
            soft_wrap=True,  # one line: the terminal wraps it
        )

    def _error(self, chunk: Any) -> None:
        self._newline()
        e = chunk.error
        retry = " (retryable)" if e.retryable else ""
        line = Text(terminal_text(f"error: {e.kind}: {e.message}{retry}"), style="bold red")
        self.console.print(line, soft_wrap=True)  # one line: the terminal wraps it

    def _abort(self, chunk: Any) -> None:
        self._newline()
        line = Text(terminal_text(f"aborted: {chunk.reason}"), style="bold yellow")
        self.console.print(line, soft_wrap=True)


_RENDER: dict[str, Callable[[TerminalRenderer, Any], None]] = {
    "reasoning-start": TerminalRenderer._reasoning_start,
    "reasoning-delta": TerminalRenderer._reasoning_delta,
    "reasoning-finish": TerminalRenderer._end_part,
    "text-delta": TerminalRenderer._text_delta,
    "text-finish": TerminalRenderer._end_part,
    "tool-input-start": TerminalRenderer._tool_input_start,
    "tool-call": TerminalRenderer._tool_call,
    "tool-result": TerminalRenderer._tool_outcome,
    "tool-error": TerminalRenderer._tool_outcome,
    "tool-approval-request": TerminalRenderer._approval_request,
    "tool-output-denied": TerminalRenderer._output_denied,
    "step-finish": TerminalRenderer._end_part,
    "reset-step": TerminalRenderer._reset_step,
    "finish": TerminalRenderer._finish,
    "error": TerminalRenderer._error,
    "abort": TerminalRenderer._abort,
}
"""How each output chunk type is shown."""


def format_cost(cost: float) -> str:
    """US dollars, to the millionth (a short answer costs fractions of a cent),
    without trailing zeros: ``$0.000435``, ``$1.25``."""
    text = f"{cost:,.6f}".rstrip("0").rstrip(".")
    return f"${text}"


def describe_usage(usage: Usage) -> str:
    """Tokens and cost in one phrase: ``10 in / 5 out tokens, $0.000435`` (or ``cost
    unknown``: a model the price table does not list, never a guess)."""
    cost = "cost unknown" if usage.cost is None else format_cost(usage.cost)
    return f"{usage.input_tokens} in / {usage.output_tokens} out tokens, {cost}"


def _fmt(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
