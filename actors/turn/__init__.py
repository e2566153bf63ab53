"""The turn: the actor that runs an agent's turn step by step, and the helpers it alone uses.

:mod:`actors.turn.runner` is the actor; the other modules are the ideas it is made of,
each a set of plain functions or small classes testable without a turn: where parts open
and close (:mod:`~actors.turn.parts`), keeping the history in step with a shared store
(:mod:`~actors.turn.session_sync`), continuing a turn another worker began
(:mod:`~actors.turn.takeover`), structured output (:mod:`~actors.turn.structured`) and
suspending for a person's input (:mod:`~actors.turn.suspension`). The runner's class is
split by concern into parts mixed into it, one module each: saving
(:mod:`~actors.turn.saving`), the model call (:mod:`~actors.turn.inference`), the tool
calls (:mod:`~actors.turn.tool_calls`), with the turn's state in
:mod:`~actors.turn.turn_state`.
"""
