"""The actors (implementation layer), each a Trio task with an inbox, assembled by the host.

Engine, turn runner, tool executor, stream controller, persister, log tap and MCP
servers here; providers/, plugins/ and relay/ hold families of them.

They import only the contract (``runtime.<module>``, never the ``runtime`` facade) and
are assembled by the application (:mod:`runtime.app.host`); see docs/architecture.md."""
