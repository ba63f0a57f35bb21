"""Why a run is placed again at an iteration boundary, and the record of each re-plan.

The run loop (:mod:`daskrl.runtime.run_loop`) carries a re-plan out: it lets the graphs in
flight go (or drains them to an output that carries the learner's full state), places the
fragments on the workers there are now and goes on under a new attempt. :class:`Replans`
decides when it asks for one and keeps what each did:

- a worker joined that placing the fragments again would use (a replica moves there);
- under ``--distribution auto``, the :class:`~daskrl.runtime.redecide.Redecider` asks to
  switch to another distribution (a trial, or its outcome); it also hears of joins the
  current distribution has no use for, of recoveries and of each switch made.

Each re-plan is a ``replan`` cell in ``metrics.csv`` and an entry of :attr:`Replans.records`
(``summary.json``'s ``replans``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from daskrl.core.placement import Placement
from daskrl.runtime.engine import Backend
from daskrl.runtime.redecide import Redecider
from daskrl.runtime.settings import RunSettings


class Replans:
    """The re-plan a run's loop owes at the next iteration boundary, if any, and those made.

    Examples
    --------
    >>> from pathlib import Path
    >>> r = Replans(RunSettings(Path("run")), joins_seen=0)
    >>> r.reason is None, r.take()
    (True, (None, None))
    """

    def __init__(self, settings: RunSettings, joins_seen: int) -> None:
        self.reason: str | None = None  # why the next boundary re-plans (None: it does not)
        self.switch_to: str | None = None  # the distribution that re-plan switches to
        self.joins_seen = joins_seen  # membership reports considered for a re-plan
        self.records: list[dict[str, Any]] = []  # each re-plan: iteration, why, placement
        # --distribution auto: re-decides while the run goes on (runtime.redecide)
        self.redecider = Redecider(settings.redecide) if settings.redecide else None

    def notice_joins(self, backend: Backend, current: Placement,
                     place_now: Callable[[], Placement]) -> None:
        """When workers joined since the last look and placing the fragments again
        (``place_now``, which may raise ``ValueError``) would use them, ask for a re-plan;
        when it would not and the run re-decides, tell the redecider, whose trial may switch
        to a distribution that uses them."""
        membership = backend.membership
        cursor = membership.cursor()
        if self.reason is not None or cursor == self.joins_seen:
            return
        joined = membership.joined_since(self.joins_seen)
        self.joins_seen = cursor
        if not joined:
            return
        try:
            placement = place_now()
        except ValueError:  # the new workers cannot host anything of this run
            return
        same = placement.workers == current.workers
        if same and self.redecider is None:
            return
        names = {addr: name for name, addr in backend.identities().items()}
        why = f"worker(s) {', '.join(sorted(names.get(a, a) for a in joined))} joined"
        if same:  # another distribution may use them: the redecider's trial
            assert self.redecider is not None
            self.redecider.cluster_changed(why, len(names))
            return
        self.reason = why

    def observe(self, rows: Sequence[Mapping[str, Any]], left: int) -> None:
        """Under ``--distribution auto``: the rows of the graph just recorded (``left``
        iterations to go) feed the redecider; a switch it asks for is the next re-plan."""
        if self.redecider is None or self.reason is not None:
            return
        decision = self.redecider.observe(
            sum(float(r.get("iteration_env_steps") or 0.0) for r in rows),
            sum(float(r.get("iteration_s") or 0.0) for r in rows), left)
        if decision is not None:
            self.switch_to, self.reason = decision

    def take(self) -> tuple[str | None, str | None]:
        """The re-plan owed, ``(reason, distribution to switch to)``; none is owed after."""
        taken = self.reason, self.switch_to
        self.reason = self.switch_to = None
        return taken

    def made(self, iteration: int, reason: str | None, moves: list[str],
             placement: Placement) -> None:
        """Record a re-plan carried out from ``iteration``."""
        self.records.append({"iteration": iteration, "reason": reason, "moves": moves,
                             "placement": {role: list(names)
                                           for role, names in placement.workers.items()}})

    def cluster_changed(self, why: str, backend: Backend) -> None:
        """The run was placed on ``backend``'s workers as they are now (a recovery): a
        re-plan owed has nothing left to do; the redecider tries the candidates there."""
        self.reason = self.switch_to = None
        if self.redecider is not None:
            self.redecider.cluster_changed(why, len(backend.identities()))

    def settled_meta(self, meta: Mapping[str, Any]) -> dict[str, Any] | None:
        """``meta`` recording the distribution the last trial chose (not a candidate being
        tried), so a resume from a checkpoint goes on under it; None when it records it
        already (or the run does not re-decide)."""
        if self.redecider is None:
            return None
        probe = meta.get("distribution_probe", {})
        if probe.get("now", probe.get("chosen")) == self.redecider.settled:
            return None
        return {**meta, "distribution_probe": {**probe, "now": self.redecider.settled}}


def since_last_switch(columns: Mapping[str, Sequence[float]],
                      records: Sequence[Mapping[str, Any]]) -> dict[str, list[float]]:
    """``metrics.csv``'s columns from the first iteration under the run's current
    distribution: the rows before its last switch (a re-plan whose moves begin with
    ``--distribution``) measured another one. Rows without an iteration (evaluations) go
    with the iteration before them.

    Examples
    --------
    >>> cols = {"iteration": [1.0, 2.0, 3.0, 4.0], "policy_lag": [0.0, 0.0, 5.0, 3.0]}
    >>> switch = {"iteration": 2, "moves": ["--distribution single -> impala"]}
    >>> since_last_switch(cols, [switch])["policy_lag"]
    [5.0, 3.0]
    >>> since_last_switch(cols, [{"iteration": 3, "moves": ["rollout 1: w0 -> w1"]}]) == cols
    True
    """
    switches = [r["iteration"] for r in records
                if any(m.startswith("--distribution ") for m in r.get("moves", ()))]
    if not switches or "iteration" not in columns:
        return {name: list(values) for name, values in columns.items()}
    start, seen, keep = switches[-1], 0.0, []
    for it in columns["iteration"]:
        seen = it if not math.isnan(it) else seen
        keep.append(seen > start)
    return {name: [v for v, k in zip(values, keep, strict=True) if k]
            for name, values in columns.items()}


def placement_moves(before: Placement, after: Placement) -> list[str]:
    """Each replica whose worker changed, as ``role replica: old -> new``.

    Examples
    --------
    >>> from daskrl.core.resources import Resources
    >>> one = Placement({"rollout": Resources(cpu=1)}, {"rollout": ("w0", "w0")})
    >>> two = Placement({"rollout": Resources(cpu=1)}, {"rollout": ("w0", "w1")})
    >>> placement_moves(one, two)
    ['rollout 1: w0 -> w1']
    """
    moves = []
    for role, names in after.workers.items():
        old = before.workers.get(role, ())
        for replica, name in enumerate(names):
            was = old[replica] if replica < len(old) else "-"
            if was != name:
                moves.append(f"{role} {replica}: {was} -> {name}")
    return moves


def with_meta(settings: RunSettings, meta: dict[str, Any] | None) -> RunSettings:
    """``settings`` with ``meta`` in place of its own (unchanged when ``meta`` is None)."""
    return settings if meta is None else dataclasses.replace(settings, meta=meta)
