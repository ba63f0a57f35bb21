"""``--max-restarts``: when the embedded cluster is lost (every worker gone for good, or its
scheduler), start a new one and resume from the last checkpoint, without a person.

A worker that dies is replaced by its nanny and the run loop recovers by itself; this covers
what the run loop cannot: no worker that can host the fragments comes back
(:class:`~daskrl.runtime.run_loop.ClusterLost`), or the connection to the scheduler breaks
(``ConnectionError``). Each restart is recorded in ``summary.json`` under ``"restarts"``: the
reason, the iteration resumed from, the iterations recorded after it that were redone, and
the seconds from the loss to the new cluster.
"""

from __future__ import annotations

import csv
import dataclasses
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from daskrl.core.algorithm import Algorithm
from daskrl.distributions import Distribution
from daskrl.observe.metrics import write_summary
from daskrl.runtime.checkpoint import list_checkpoints, load_latest
from daskrl.runtime.driver import train
from daskrl.runtime.engine import Backend
from daskrl.runtime.run_loop import ClusterLost
from daskrl.runtime.settings import RunSettings


def train_with_restarts(backend: Backend, restart: Callable[[], Backend], algo: Algorithm,
                        distribution: Distribution, settings: RunSettings) -> dict[str, Any]:
    """:func:`~daskrl.runtime.driver.train`, started again on ``restart()``'s new backend
    after a lost cluster, up to ``settings.max_restarts`` times; the final summary, with
    ``"restarts"``.

    ``restart`` closes the lost cluster and returns a backend on a new one.

    Examples
    --------
    >>> import tempfile
    >>> from daskrl.runtime.sync_backend import SyncBackend
    >>> from daskrl.distributions import get_distribution
    >>> train_with_restarts(SyncBackend(), SyncBackend, None, get_distribution("single"),
    ...                     RunSettings(Path(tempfile.mkdtemp()), steps=0))
    Traceback (most recent call last):
    ...
    ValueError: --steps must be >= 1, got 0
    """
    restarts: list[dict[str, Any]] = []
    while True:
        try:
            summary = train(backend, algo, distribution, settings)
            break
        except (ClusterLost, ConnectionError) as exc:
            if len(restarts) >= settings.max_restarts:
                raise
            lost_at = time.monotonic()
            # the advice to resume by hand is what this does
            why = " ".join(str(exc).split()).removesuffix(": restart the run with --resume")
            print(f"daskrl: {why}; starting a new cluster and resuming from the last checkpoint "
                  f"(restart {len(restarts) + 1} of {settings.max_restarts})", file=sys.stderr,
                  flush=True)
            backend = restart()
            ckpt = load_latest(settings.out / "checkpoints")
            resumed = int(ckpt["iteration"]) if ckpt is not None else 0
            restarts.append({"reason": why, "resumed_from_iteration": resumed,
                             "iterations_redone": _recorded(settings.out) - resumed,
                             "restart_s": time.monotonic() - lost_at})
            settings = dataclasses.replace(
                settings, resume=bool(list_checkpoints(settings.out / "checkpoints")))
    if restarts:
        summary["restarts"] = restarts
        write_summary(settings.out / "summary.json", summary)
    return summary


def _recorded(out: Path) -> int:
    """The last iteration ``metrics.csv`` records."""
    path = out / "metrics.csv"
    if not path.exists():
        return 0
    with path.open(newline="") as fh:
        done = [int(r["iteration"]) for r in csv.DictReader(fh) if r.get("iteration")]
    return max(done, default=0)
