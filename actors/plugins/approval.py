"""``ApprovalActor``: an in-process gate for tools marked ``needs_approval``.

Without it, such a call suspends its turn durably and a decision comes through
``session.respond`` (docs/approval.md). With it running on the host, the call waits in
memory instead, as it always did:
the tool executor publishes :class:`~runtime.events.ToolApprovalRequested` and waits;
this actor answers with :class:`~runtime.events.ToolApprovalDecided`. With a ``policy``
(``call -> (approved, reason)``, or ``call -> approved``; sync or async) it decides at
once; without one it keeps the request pending until the application calls
:meth:`approve` or :meth:`deny` (a UI's buttons). A denial reaches the model as the tool's
error result: it can react to it.

A policy fails closed: only ``True`` approves (a policy returning ``"no"`` or
``("deny", reason)`` approved the call, those being true), and a policy that raises
denies the call at once, saying so (it crashed the actor, and the call waited out the
executor's ``approval_timeout``, five minutes by default).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, ClassVar

from runtime.actor import Actor
from runtime.errors import describe_exception
from runtime.events import ToolApprovalDecided, ToolApprovalRequested
from runtime.inbox import OverflowPolicy
from runtime.redact import redact

Policy = Callable[[ToolApprovalRequested], Any]


class ApprovalActor(Actor):
    subscribes_to: ClassVar[Any] = (ToolApprovalRequested,)
    overflow: ClassVar[OverflowPolicy] = "block"
    decides_approvals: ClassVar[bool] = True
    """While it runs, calls that need approval wait for it in memory (the tool executor's
    ``approval_timeout``) instead of suspending their turn (docs/approval.md)."""

    def __init__(
        self, policy: Policy | None = None, *, name: str = "approval", session_id: str | None = None
    ) -> None:
        super().__init__(name=name, session_id=session_id)
        self.policy = policy
        self.pending: dict[str, ToolApprovalRequested] = {}
        """Requests waiting for a person's decision, by tool call id."""

    async def handle(self, request: Any) -> None:
        if not isinstance(request, ToolApprovalRequested):
            return
        if self.policy is None:
            self.pending[request.tool_call_id] = request
            return
        try:
            verdict = self.policy(request)
            if inspect.isawaitable(verdict):
                verdict = await verdict
        except Exception as exc:
            failed = f"the approval policy raised {describe_exception(exc)}"
            await self._decide(request, False, redact(failed))
            return
        approved: Any = verdict
        reason: Any = None
        if isinstance(verdict, tuple):
            approved = verdict[0] if verdict else None
            reason = verdict[1] if len(verdict) > 1 else None
        if approved is not True and approved is not False:
            kind = type(approved).__name__
            approved, reason = False, f"the approval policy answered {kind}, not True or False"
        await self._decide(request, approved, None if reason is None else str(reason))

    async def approve(self, tool_call_id: str) -> None:
        await self._decide(self.pending.pop(tool_call_id), True, None)

    async def deny(self, tool_call_id: str, reason: str = "denied by the user") -> None:
        await self._decide(self.pending.pop(tool_call_id), False, reason)

    async def _decide(
        self, request: ToolApprovalRequested, approved: bool, reason: str | None
    ) -> None:
        await self.publish(
            ToolApprovalDecided(
                session_id=request.session_id,
                turn_id=request.turn_id,
                tool_call_id=request.tool_call_id,
                approved=approved,
                reason=reason,
                causation_id=request.tool_call_id,
            )
        )
