"""The scheduler plugin behind the dashboard's daskrl page: :class:`RunBoard`.

It hears every scheduler event through ``SchedulerPlugin.log_event`` and hands those of
:data:`~daskrl.observe.board.TOPIC` to its :class:`~daskrl.observe.board.Board`; while
the scheduler runs, the board's runs are Prometheus gauges on its ``/metrics``
(:mod:`daskrl.observe.board_metrics`).

Every daskrl driver registers it (``Client.register_plugin``; idempotent, so the first one
stays and every run on the scheduler shares it); ``dask scheduler --preload
daskrl.observe.board_plugin`` has it from the scheduler's start (:func:`dask_setup`).

Examples
--------
>>> from daskrl.observe.board import TOPIC
>>> plugin = RunBoard()
>>> plugin.log_event(TOPIC, {"kind": "row", "run": "r1", "row": {"iteration": 1}})
>>> plugin.log_event("another-topic", {"run": "r2"})
>>> list(plugin.board.runs)
['r1']
"""

from __future__ import annotations

from typing import Any

from distributed.diagnostics.plugin import SchedulerPlugin

from daskrl.observe.board import PLUGIN, TOPIC, Board
from daskrl.observe.board_metrics import export, unexport


class RunBoard(SchedulerPlugin):
    """Keeps the runs the scheduler serves in :attr:`board` (see the module notes).

    Parameters
    ----------
    keep, max_runs : int
        The board's bounds (:class:`~daskrl.observe.board.Board`).
    """

    name = PLUGIN
    idempotent = True  # one per scheduler: a second driver must not wipe the first's runs

    def __init__(self, keep: int = 500, max_runs: int = 64) -> None:
        self.board = Board(keep, max_runs)

    async def start(self, scheduler: Any) -> None:
        """Export the board's runs on this process's ``/metrics``."""
        export(self.board)

    async def close(self) -> None:
        """Stop exporting them (the scheduler is closing)."""
        unexport(self.board)

    def log_event(self, topic: str, msg: Any) -> None:
        """Take a message of the board's topic (the scheduler calls this for every topic)."""
        if topic == TOPIC:
            self.board.take(msg)


async def dask_setup(scheduler: Any) -> None:
    """Preload hook (``dask scheduler --preload daskrl.observe.board_plugin``): the
    scheduler starts with :class:`RunBoard`; drivers that connect later keep it."""
    await scheduler.register_scheduler_plugin(RunBoard(), idempotent=True)
