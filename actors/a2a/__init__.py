"""A2A (Agent2Agent): the protocol's wire shapes (:mod:`actors.a2a.wire`; 0.3's in
:mod:`actors.a2a.legacy`), shared by
``serve --protocols a2a`` (:mod:`runtime.app.web.a2a`) and by :class:`A2AAgent`, the
client that lets an Axon agent delegate to a remote A2A agent as a tool."""

from __future__ import annotations

from actors.a2a.agent import A2AAgent, RemoteAgentError

__all__ = ["A2AAgent", "RemoteAgentError"]
