"""The dashboard's daskrl page: a route module for ``distributed.scheduler.http.routes``.

Serves, on the scheduler's own HTTP server (the dashboard's address, nothing new bound):

``/daskrl``
    A page with one row per run (its latest figures, the split of its latest iteration's
    time) and the curves of every run over env steps: return (evaluations as dots),
    env-steps/s, and policy lag, learner busy and replay size where the distribution
    records them. Above them, once a sweep has reported, one table per sweep: each trial's
    state, env steps of its target, latest return and eval return. It asks for
    ``/daskrl/runs.json`` every second (``?every=S`` changes it).
``/daskrl/runs.json``
    What the scheduler's :class:`~daskrl.observe.board.Board` holds
    (:meth:`~daskrl.observe.board.Board.as_json`).

Why a small HTML page that polls JSON, not a Bokeh app like the dashboard's own pages:
a route module is the scheduler's public way to serve more pages, and it is served from
the scheduler's start, while Bokeh apps are added through a registry of
``distributed.dashboard`` that is not public (and daskrl's embedded scheduler loads Bokeh
only when a dashboard page is first asked for, see
:func:`daskrl.compat.serve_dashboard_on_demand`). A Bokeh page keeps a session per open
tab on the scheduler's event loop, with periodic callbacks there; a polled JSON costs one
small request per tab per second, serialised once per change whatever the number of
tabs, and is an API of its own for scripts and sweeps. The page draws with inline SVG
and needs nothing from the internet.

Enable it on a scheduler you start yourself by adding this module to
``distributed.scheduler.http.routes`` (see ``docs/howto/dashboard.md``); daskrl does it for
the clusters it starts (:func:`daskrl.cluster.local.dask_settings`).
"""

from __future__ import annotations

import json
import time
from importlib import resources
from typing import Any

from tornado import web

from daskrl.observe.board import PLUGIN, Board
from daskrl.observe.board_plugin import RunBoard

MISSING = (f"no {PLUGIN} plugin on this scheduler yet: it comes with the first daskrl run "
           "(Client.register_plugin), or start the scheduler with "
           "--preload daskrl.observe.board_plugin")
"""What the page says before any daskrl driver has connected."""


class _OnScheduler(web.RequestHandler):
    """A handler given the scheduler (Dask passes ``dask_server`` to ``initialize``)."""

    def initialize(self, dask_server: Any = None) -> None:
        self.server = dask_server

    def board(self) -> Board | None:
        plugin = self.server.plugins.get(PLUGIN) if self.server is not None else None
        return plugin.board if isinstance(plugin, RunBoard) else None


class RunsJSON(_OnScheduler):
    """``/daskrl/runs.json``: ``{"now": <scheduler time>, "board": Board.as_json()}``."""

    def get(self) -> None:
        board = self.board()
        body = (board.as_text() if board is not None
                else json.dumps({"version": 0, "runs": [], "sweeps": [],
                                   "note": MISSING}))
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")
        self.write(f'{{"now": {time.time()!r}, "board": {body}}}')


class BoardPage(_OnScheduler):
    """``/daskrl``: the page (:file:`board.html`, next to this module)."""

    def get(self) -> None:
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.write(resources.files("daskrl.observe").joinpath("board.html").read_text())


routes: list[tuple[str, type, dict]] = [
    (r"/daskrl/?", BoardPage, {}),
    (r"/daskrl/runs\.json", RunsJSON, {}),
]
"""What Dask's ``get_handlers`` reads from a module named in
``distributed.scheduler.http.routes`` (it adds the dashboard's prefix)."""
