"""The driver's side of the dashboard's daskrl page: each metrics row sent to the scheduler.

:class:`RunFeed` sends a run's start, its rows (cut down to
:data:`~daskrl.observe.board.FIGURES`) and its end as events of
:data:`~daskrl.observe.board.TOPIC` (``Client.log_event``), where the scheduler's
:class:`~daskrl.observe.board.RunBoard` takes them. A thread of its own sends them, so
the driver never waits for the scheduler, and a scheduler that does not answer costs the
run nothing but its page: the first failure is reported once on stderr, and what waits to
be sent is bounded (:attr:`RunFeed.pending`, oldest dropped first).

A sweep sends its table of trials on the same topic, as :func:`sweep_message` makes it.
"""

from __future__ import annotations

import collections
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from daskrl.observe.board import ROUTES, TOPIC, figures, scalars


class RunFeed:
    """Sends one run's messages to the scheduler's board, from a thread of its own.

    Parameters
    ----------
    publish : callable
        ``publish(topic, message)``: ``Client.log_event``, or the backend's ``publish``.
    run : str
        The run id: the board keys everything by it (the page's row, the gauges' label).
    meta : dict
        Said once, at the start: ``name`` (the output folder's name), ``out``, ``graph``,
        ``distribution``, ``iterations``... (strings and numbers).

    Examples
    --------
    >>> sent = []
    >>> feed = RunFeed(lambda topic, msg: sent.append(msg), "r1", {"name": "ppo-1"})
    >>> feed.row({"iteration": 1, "env_steps": 64, "losses/value_loss": 0.5})
    >>> feed.end("finished")
    >>> [m["kind"] for m in sent], sent[1]["row"]
    (['start', 'row', 'end'], {'iteration': 1.0, 'env_steps': 64.0})
    """

    pending = 1000
    """Messages held while the scheduler is slow; beyond it the oldest are dropped."""

    def __init__(self, publish: Callable[[str, Any], Any], run: str,
                 meta: Mapping[str, Any]) -> None:
        self.publish, self.run = publish, run
        self.queue: collections.deque[dict[str, Any] | None] = collections.deque(
            maxlen=self.pending)
        self.ready = threading.Condition()
        self.failed: BaseException | None = None
        self.thread = threading.Thread(target=self._send, name="daskrl-board-feed",
                                       daemon=True)
        self.thread.start()
        self._put({"kind": "start", "run": run, "started": time.time(),
                   **{k: v for k, v in meta.items() if isinstance(v, (str, int, float))}})

    def row(self, row: Mapping[str, Any]) -> None:
        """Send a ``metrics.csv`` row's figures (as soon as the thread can)."""
        self._put({"kind": "row", "run": self.run, "row": figures(row)})

    def end(self, status: str, timeout: float = 5.0) -> None:
        """Send the run's last status (``finished``, ``stopped``, ``failed``) and wait up to
        ``timeout`` seconds for what is still to be sent."""
        self._put({"kind": "end", "run": self.run, "status": status})
        self._put(None)
        self.thread.join(timeout)

    def _put(self, msg: dict[str, Any] | None) -> None:
        with self.ready:
            self.queue.append(msg)
            self.ready.notify()

    def _send(self) -> None:
        while True:
            with self.ready:
                self.ready.wait_for(lambda: bool(self.queue))
                msg = self.queue.popleft()
            if msg is None:
                return
            try:
                self.publish(TOPIC, msg)
            except Exception as exc:  # noqa: BLE001 - the page must never stop a run
                if self.failed is None:
                    self.failed = exc
                    print(f"daskrl: the run's page on the dashboard stopped updating: the "
                          f"scheduler did not take its metrics ({type(exc).__name__}: {exc})",
                          file=sys.stderr)


def sweep_message(sweep: str, meta: Mapping[str, Any],
                  trials: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """A sweep's message for the board: its whole table of trials, which replaces the last
    one the board holds for ``sweep`` (send it with ``publish(TOPIC, message)``).

    Parameters
    ----------
    sweep : str
        The sweep id: the board keys the sweep by it.
    meta : dict
        ``name`` (the sweep's folder name), ``out`` (its path) and ``mode`` (``seeds``,
        ``grid``, ``search`` or ``pbt``); its strings and numbers are sent.
    trials : list of dict
        One per trial: ``name``, ``state`` (one of
        :data:`~daskrl.observe.board.TRIAL_STATES`), ``env_steps``, ``steps`` (its
        target), ``return`` (the latest ``episode_return_mean``), ``eval_return`` and
        ``run`` (the run id, or None before it starts). Strings, numbers and Nones are sent,
        numpy's scalars as Python's and a NaN or infinity as None
        (:func:`~daskrl.observe.board.scalars`).

    Returns
    -------
    dict
        ``{"kind": "sweep", "sweep": sweep, "name", "out", "mode", "updated": time.time(),
        "trials": [...]}``.

    Examples
    --------
    >>> msg = sweep_message("5f3a9c1e", {"name": "lr-grid", "out": "/runs/lr-grid",
    ...                                  "mode": "grid"},
    ...                     [{"name": "t000-lr=0.001", "state": "running", "env_steps": 512,
    ...                       "steps": 4096, "return": float("nan"), "eval_return": None,
    ...                       "run": "ab12cd34"}])
    >>> msg["kind"], msg["sweep"], msg["name"], msg["mode"]
    ('sweep', '5f3a9c1e', 'lr-grid', 'grid')
    >>> msg["trials"][0]["return"], msg["trials"][0]["env_steps"]
    (None, 512)
    """
    return {**scalars(meta), "kind": "sweep", "sweep": sweep, "updated": time.time(),
            "trials": [scalars(trial) for trial in trials]}


def page_line(dashboard_link: str, timeout: float = 2.0) -> str:
    """The line the driver prints about the page: its address, or what to set when the
    scheduler does not serve it (asked with one GET of its JSON).

    Examples
    --------
    >>> page_line("http://127.0.0.1:9/status", timeout=0.5)  # nothing listens there
    'daskrl page: http://127.0.0.1:9/daskrl (did not answer: Connection refused)'
    """
    link = dashboard_link.rsplit("/", 1)[0] + "/daskrl"
    try:
        with urllib.request.urlopen(f"{link}/runs.json", timeout=timeout):
            return f"daskrl page: {link}"
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return (f"daskrl page: not served by this scheduler; add {ROUTES} to its "
                    "distributed.scheduler.http.routes (docs/howto/dashboard.md)")
        return f"daskrl page: {link} (answered {exc.code} {exc.reason})"
    except urllib.error.URLError as exc:  # refused, unreachable, timed out
        reason = exc.reason
        why = reason.strerror if isinstance(reason, OSError) and reason.strerror else reason
        return f"daskrl page: {link} (did not answer: {why})"
    except (OSError, ValueError) as exc:
        return f"daskrl page: {link} (did not answer: {exc})"
