"""The application layer: what assembles the actors into something a person runs.

:mod:`runtime.app.host` starts the shared actors and opens sessions
(:mod:`runtime.app.session`); around them sit the ways in: the blocking and asyncio
wrappers (:mod:`runtime.app.blocking`, :mod:`runtime.app.aio`), the command line
(:mod:`runtime.app.cli`, :mod:`runtime.app.commands`, :mod:`runtime.app.render`, the
demo), the HTTP server (:mod:`runtime.app.web`), the worker of the distributed mode
(:mod:`runtime.app.worker`) and the expiry of waits (:mod:`runtime.app.expiry`).

Nothing below this package imports it: the contract (:mod:`runtime`'s own modules) and
the implementations (:mod:`actors`) know nothing of hosts, sessions or servers. Users
import the application's names from the flat facade (``from runtime import Host``).
"""
