"""``--distribution auto`` re-decides while the run goes on.

The probe before training (:mod:`daskrl.runtime.auto`) picks the fastest distribution for
the cluster and the workload as they were at the start. Both change: workers join and
leave (``--adapt``, a pre-empted job), and a workload's cost moves (an off-policy learner
starts updating once its replay holds ``learning_starts`` transitions; a replay fills; an
env's episodes lengthen). A :class:`Redecider`, held by the run loop, watches each finished
graph's env steps and seconds on the learner's clock and re-decides when

- the cluster changed: a worker joined (the run placed its fragments again) or left (the
  run recovered on the workers left), or
- the rate drifted: the median rate of the last :attr:`RedecidePlan.window` graphs moved
  by more than :attr:`RedecidePlan.drift` from the median of the first window after the
  last decision.

Re-deciding is a trial inside the run itself, not a separate probe: the run trains under
each candidate in turn for :attr:`RedecidePlan.trial_s` seconds (after one graph that
carries the switch's start-up, which is not timed), except one that cannot catch up (its
probe rate, scaled by the cluster's growth in workers since the probe, below
:data:`CATCH_UP` of the best rate the trial measured); then it settles on the fastest within
:data:`~daskrl.runtime.auto.NOISE` (the distribution it ran before the trial first among
equals). Every switch happens at an iteration boundary through the run loop's re-plan,
from an output that carries the learner's full state (weights, optimiser, normalisation,
replay), so no update is lost or repeated and a trial costs only the switches' start-ups.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections import deque
from collections.abc import Mapping
from typing import Any

from daskrl.distributions import get_distribution

NOISE = 0.05
"""Rates within this share of the best count as equal, in the probe before training
(:mod:`daskrl.runtime.auto`: the graph's own distribution, or the earlier candidate, wins
among them) and in a trial (the distribution that ran before it wins among them), so
run-to-run noise does not flip the choice."""


CATCH_UP = 0.5
"""A candidate is tried only if its probe rate, times the cluster's growth in workers since
the probe, reaches this share of the best rate measured in the trial: the probe's ranking
may change with the cluster and the workload, but not by more than that (a task per env
step stays slow for a cheap env on any cluster)."""


@dataclasses.dataclass(frozen=True)
class RedecidePlan:
    """What a run under ``--distribution auto`` may switch between, and when it re-decides.

    Examples
    --------
    >>> plan = RedecidePlan(("actors-learner", "single"))
    >>> plan.window, plan.drift, plan.trial_s
    (10, 0.25, 1.0)
    >>> RedecidePlan(("single", "apex"))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: a run cannot switch to or from apex mid-run ...
    """

    candidates: tuple[str, ...]
    """The distributions the probe measured (the graph's own first)."""
    start: str = ""
    """The one the run starts under (the probe's choice; default: the first candidate)."""
    window: int = 10
    """Graphs whose median rate is compared with the reference; also the fewest iterations
    left for a trial to start."""
    drift: float = 0.25
    """A sustained change of the rate by more than this share (either way) re-decides."""
    trial_s: float = 1.0
    """Seconds (learner clock) each candidate trains in a trial, after its first graph."""
    max_trials: int = 4
    """Trials a run makes at most (a workload whose rate never settles does not spend its
    run switching)."""
    rates: tuple[float, ...] = ()
    """Each candidate's rate in the probe (env-steps/s), in :attr:`candidates`' order."""
    workers: int = 0
    """Workers the cluster had at the probe (0: not known)."""

    def __post_init__(self) -> None:
        fixed = [c for c in self.candidates if not get_distribution(c).switchable]
        if fixed:
            raise ValueError(f"a run cannot switch to or from {', '.join(fixed)} mid-run (its "
                             "learner's state is not all in the learner output): leave it "
                             "out of the candidates")

    def record(self) -> dict[str, Any]:
        """What ``summary.json`` keeps of it."""
        return dataclasses.asdict(self)


class Redecider:
    """Decides when a run under ``--distribution auto`` tries the other distributions, and
    which one it settles on. Fed one finished graph at a time (:meth:`observe`); returns
    the distribution to switch to, with why, or None.

    Examples
    --------
    A steady run is left alone; a sustained slow-down starts a trial of the other
    candidate; the trial measures it and settles on the faster:

    >>> r = Redecider(RedecidePlan(("single", "actors-learner"), window=3, trial_s=1.0),
    ...               "single")
    >>> [r.observe(1000, 1.0, left=100) for _ in range(3)]  # the reference: 1,000/s
    [None, None, None]
    >>> [r.observe(1000, 1.0, left=100) for _ in range(3)]
    [None, None, None]
    >>> r.observe(500, 1.0, left=100)  # one slow graph: the window's median holds
    >>> r.observe(500, 1.0, left=100)  # doctest: +ELLIPSIS
    ('actors-learner', 'the rate moved from 1,000 to 500 env-steps/s ...')
    >>> r.switched("actors-learner")
    >>> r.observe(900, 3.0, left=90)  # its first graph carries the start-up: not timed
    >>> r.observe(900, 1.0, left=89)  # 900/s against single's 500/s: it stays
    >>> r.to_try is None, r.current
    (True, 'actors-learner')
    >>> r.changes[-1]["rates"]
    {'single': 500.0, 'actors-learner': 900.0}

    A worker joins: the current distribution is timed first, on the cluster as it is now;
    a candidate whose probe rate could not reach half of that even with twice the workers
    is not tried:

    >>> plan = RedecidePlan(("actors-learner", "single", "central-inference"),
    ...                     "actors-learner", rates=(900.0, 880.0, 60.0), workers=1)
    >>> r = Redecider(plan)
    >>> r.cluster_changed("worker(s) w1 joined", workers=2)
    >>> r.observe(900, 3.0, left=100)  # the graph after the re-placement: not timed
    >>> r.observe(1700, 1.0, left=99)
    ('single', 'worker(s) w1 joined: trying single')
    >>> r.switched("single")
    >>> r.observe(900, 3.0, left=90), r.observe(900, 1.0, left=89)  # doctest: +ELLIPSIS
    (None, ('actors-learner', 'worker(s) w1 joined: actors-learner was the fastest (1,700 ...'))
    >>> r.changes[-1]["skipped"]["central-inference"]
    'at most 120 env-steps/s (its probe rate scaled by the workers since)'
    """

    def __init__(self, plan: RedecidePlan, current: str | None = None) -> None:
        current = current or plan.start or plan.candidates[0]
        self.plan, self.current = plan, current
        self.rates: deque[float] = deque(maxlen=plan.window)
        self.reference: float | None = None  # the first window's median after a decision
        self.skip = 0  # graphs not timed: the first after a switch or a re-placement
        self.to_try: list[str] | None = None  # a trial's candidates still to try (None: none)
        self.measured: dict[str, float] = {}  # this trial's rates
        self.before = current  # what ran before the trial: first among equals
        self.steps = 0.0  # this candidate's timed env steps and seconds in the trial
        self.seconds = 0.0
        self.reason = ""
        self.trials = 0
        self.pending_why: str | None = None  # why a trial starts at the next graph
        self.settled = self.current  # the last trial's choice (where a resume goes on)
        self.changes: list[dict[str, Any]] = []
        self.workers = plan.workers  # on the cluster now
        self.skipped: dict[str, str] = {}  # this trial's candidates that could not catch up

    def cluster_changed(self, why: str, workers: int = 0) -> None:
        """Workers joined or left (``workers`` now; 0: not known): try the candidates on
        the cluster as it is now (the current one first, placed anew). A trial under way
        starts over (what it measured was on the cluster as it was), as a trial of its own
        (:attr:`RedecidePlan.max_trials` counts it)."""
        self.skip = 1
        self.pending_why = why
        self.workers = workers or self.workers
        self.to_try = None

    def refused(self, spec: str, why: str) -> None:
        """Switching to ``spec`` failed (it could not be placed): the trial goes on without
        it, under the distribution that ran; the graphs let go restart it (not timed)."""
        self.skip = 1
        self.steps = self.seconds = 0.0
        self.measured.pop(spec, None)
        self.changes.append({"reason": f"{spec} could not be placed: {why}", "rates": {},
                             "from": self.current, "chosen": self.current})

    def switched(self, spec: str, workers: int = 0) -> None:
        """The run now trains under ``spec`` (``workers`` on the cluster; 0: not known);
        its first graph is not timed."""
        self.current, self.skip = spec, 1
        self.steps = self.seconds = 0.0
        self.workers = workers or self.workers

    def observe(self, env_steps: float, seconds: float, left: int
                ) -> tuple[str, str] | None:
        """One finished graph: ``env_steps`` in ``seconds`` (learner clock), ``left``
        iterations to go. The distribution to switch to now, and why; or None."""
        if self.skip:
            self.skip -= 1
            return None
        if not (seconds > 0 and math.isfinite(seconds)):
            return None
        if self.to_try is not None:
            return self._trial_step(env_steps, seconds)
        if self.pending_why is not None:  # placed anew: time the current one first, as it is
            why, self.pending_why = self.pending_why, None
            if not self._begin(why, left):
                return self._give_up()
            self.measured, self.to_try, self.skipped = {}, self._others(), {}
            self.steps = self.seconds = 0.0
            return self._trial_step(env_steps, seconds)
        self.rates.append(env_steps / seconds)
        if len(self.rates) < self.plan.window:
            return None
        median = statistics.median(self.rates)
        if self.reference is None:
            self.reference = median
            self.rates.clear()
            return None
        low, high = (1 - self.plan.drift) * self.reference, (1 + self.plan.drift) * self.reference
        if low <= median <= high:
            return None
        why = (f"the rate moved from {self.reference:,.0f} to {median:,.0f} env-steps/s "
               f"over the last {self.plan.window} graphs under {self.current}")
        if not self._begin(why, left):
            return None
        self.measured = {self.current: median}  # the window just seen times the current one
        self.to_try, self.skipped = self._others(), {}
        return self._next_or_settle()

    def _others(self) -> list[str]:
        return [c for c in self.plan.candidates if c != self.current]

    def _begin(self, why: str, left: int) -> bool:
        """Whether a trial starts now (enough iterations left, trials left, something else
        to try); if not, the rate is measured afresh from here."""
        if left < self.plan.window or self.trials >= self.plan.max_trials or not self._others():
            self.reference = None
            self.rates.clear()
            return False
        self.trials += 1
        self.before, self.reason = self.current, why
        return True

    def _give_up(self) -> tuple[str, str] | None:
        """A trial that cannot start (or start over): back to the last trial's choice if
        the run is under another candidate."""
        if self.current == self.settled:
            return None
        self.changes.append({"reason": "trial given up (too few iterations left or trials "
                             "spent)", "rates": {}, "skipped": {}, "from": self.current,
                             "chosen": self.settled})
        return self.settled, f"back to {self.settled}, the last trial's choice"

    def _trial_step(self, env_steps: float, seconds: float) -> tuple[str, str] | None:
        self.steps += env_steps
        self.seconds += seconds
        if self.seconds < self.plan.trial_s:
            return None
        self.measured[self.current] = self.steps / self.seconds
        return self._next_or_settle()

    def _next_or_settle(self) -> tuple[str, str] | None:
        """The next candidate that can catch up, or the trial's end."""
        assert self.to_try is not None
        best = max(self.measured.values())
        while self.to_try:
            nxt = self.to_try.pop(0)
            ceiling = self._ceiling(nxt)
            if ceiling is not None and ceiling < CATCH_UP * best:
                self.skipped[nxt] = (f"at most {ceiling:,.0f} env-steps/s (its probe rate "
                                     "scaled by the workers since)")
                continue
            return nxt, f"{self.reason}: trying {nxt}"
        return self._settle()

    def _ceiling(self, spec: str) -> float | None:
        """``spec``'s probe rate times the cluster's growth since the probe (None: no
        probe rate)."""
        plan = self.plan
        if len(plan.rates) != len(plan.candidates) or not plan.workers:
            return None
        rate = plan.rates[plan.candidates.index(spec)]
        return rate * max(1.0, self.workers / plan.workers)

    def _settle(self) -> tuple[str, str] | None:
        order = [self.before] + [c for c in self.plan.candidates if c != self.before]
        best = max(self.measured.values())
        winner = next(c for c in order
                      if self.measured.get(c, 0.0) >= (1 - NOISE) * best)
        self.changes.append({"reason": self.reason, "rates": dict(self.measured),
                             "skipped": dict(self.skipped), "from": self.before,
                             "chosen": winner})
        self.to_try, self.reference, self.settled = None, None, winner
        self.rates.clear()
        if winner == self.current:
            return None
        rate = self.measured[winner]
        return winner, (f"{self.reason}: {winner} was the fastest "
                        f"({rate:,.0f} env-steps/s of {len(self.measured)} tried)")

    def record(self) -> dict[str, Any]:
        """``summary.json``'s ``distribution_redecided``: the plan and each trial."""
        return {"plan": self.plan.record(), "trials": self.changes, "final": self.current}


def plan_from_probe(record: Mapping[str, Any]) -> RedecidePlan | None:
    """The re-decision plan from a probe's record (``distribution_probe``): the candidates
    with a measured rate that a run can switch to and from
    (:attr:`~daskrl.distributions.base.Distribution.switchable`), in the probe's order,
    starting under its choice (or the latest re-decision's, on a resume); None with fewer
    than two, or when the run starts under one it cannot leave.

    Examples
    --------
    >>> plan = plan_from_probe({"chosen": "single", "candidates": [
    ...     {"distribution": "actors-learner", "env_steps_per_s": 900.0},
    ...     {"distribution": "impala", "env_steps_per_s": None},
    ...     {"distribution": "single", "env_steps_per_s": 1000.0}]})
    >>> plan.candidates, plan.start, plan.rates
    (('actors-learner', 'single'), 'single', (900.0, 1000.0))
    >>> plan_from_probe({"chosen": "single", "candidates": [
    ...     {"distribution": "single", "env_steps_per_s": 10.0},
    ...     {"distribution": "apex", "env_steps_per_s": 20.0}]}) is None
    True
    """
    kept = [c for c in record.get("candidates", ())
            if c.get("env_steps_per_s") and get_distribution(c["distribution"]).switchable]
    specs = tuple(c["distribution"] for c in kept)
    start = record.get("now") or record["chosen"]
    if len(specs) < 2 or start not in specs:
        return None
    return RedecidePlan(specs, start, rates=tuple(float(c["env_steps_per_s"]) for c in kept),
                        workers=int(record.get("workers") or 0))
