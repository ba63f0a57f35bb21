"""The learner's torch threads, chosen by timing its updates.

A task runs torch with as many threads as its CPU grant (one by default), so that tasks
computing at once do not fight over cores. A learner that works alone (a lockstep
distribution: the rollouts wait for its update, and the update for them) leaves the other
cores of its host idle while it updates: on two cores PPO's Nature-CNN update on Breakout
takes 3.1 s on both against 5.6 s on one, and SAC's run on Pendulum-v1 (256-unit critics)
ends 1.39x sooner (``benchmarks/learner_threads.md``, ``benchmarks/atari_speed.md``).
Whether more threads help depends on the network (a 64-unit MLP's kernels are too small to
split, and waking threads costs more than it saves) and on what else the host runs, so
:class:`ThreadChoice` measures instead of assuming: after an untimed first update (the
first that takes gradient steps: a replay learner's updates before its replay holds
``learning_starts`` transitions only store) it alternates the grant and every core this
process may use, a few updates each, and keeps the faster by the median wall time (more
threads only when at least 10 % faster, since a tie is better left to the other
processes); a count 25 % faster in every update so far is kept after one update of each.

:func:`learner_threads` wraps one update; the choice lives with the worker's resident
learner, so a rebuilt learner (a lost worker, a resumed run) measures again.

The choice is measured again when the kept count's own updates get :data:`SHIFT` faster or
slower than when it was kept (its updates in the measurement and its first ones after: the
host's load changed, another run that started beside this one ended), looked for once the
kept count has run :data:`SETTLE` times as long as the measurement that kept it, and in any
case once it has run :data:`REVISIT` times as long (so measuring costs at most about 5 % of
the learner's time while the load holds, and at most about 25 % if updates were to swing by
more than :data:`SHIFT` all the time). A choice made while the host was busy is not kept for
the whole run.

Limits: each measurement sees only the learner's own time: a periodic evaluation
(``--eval-every``) or another run on the same workers (a sweep's trials) running meanwhile
is not weighed, and when more threads were kept they compete with it until the next
measurement. A compiled step (``--compile``) keeps the thread count of its fused
kernels from when it compiled (inductor writes it into the kernels); only its library
calls (matrix products) follow the count.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Iterator, MutableMapping
from contextlib import contextmanager
from typing import Any

import torch

from daskrl.core.envs import usable_cpus

MARGIN = 0.9
"""More threads are kept only when their median update takes at most this share of the
grant's."""

CLEAR = 0.75
"""A count whose every update so far took at most this share of the other's fastest is
kept at once, without the remaining trials (a slow update, a CNN's, costs seconds each)."""

REVISIT = 20.0
"""A kept count is measured again after it has run for this many times the wall time of
the measurement that kept it (every timed update of that round, at each count)."""

SHIFT = 0.25
"""A kept count is measured again when the median of its last :data:`WINDOW` updates is
more than this share faster or slower than the median of its updates in the measurement
that kept it and its first :data:`WINDOW` updates after."""

WINDOW = 5
"""Updates of the kept count whose medians :data:`SHIFT` compares (one slow update, a
checkpoint or a collection pass, does not move them)."""

SETTLE = 4.0
"""A shift is looked for only once the kept count has run this many times as long as the
measurement that kept it: updates that swing all the time cannot make measuring the larger
part of the learner's time."""


class ThreadChoice:
    """Times updates at the grant's thread count and at ``cores``, and keeps the faster.

    Parameters
    ----------
    grant : int
        The task's threads (its CPU grant): the count when more do not pay.
    cores : int
        CPUs this process may run on.
    trials : int
        Timed updates of each count before choosing.

    Examples
    --------
    >>> choice = ThreadChoice(1, 2, trials=2)
    >>> for seconds in (9.0, 1.0, 0.8, 1.1, 0.85):  # the first is not timed
    ...     n = choice.next()
    ...     choice.record(n, seconds)
    >>> choice.chosen, choice.medians()
    (2, {1: 1.05, 2: 0.825})
    >>> ThreadChoice(2, 2).next()  # nothing beyond the grant to try
    2
    >>> for seconds in [0.8] * 20 + [2.4] * 3:  # then its updates take 3x as long
    ...     choice.record(2, seconds)
    >>> choice.chosen, choice.next(), choice.rounds  # the load changed: measuring again
    (None, 1, 2)
    """

    def __init__(self, grant: int, cores: int, trials: int = 3) -> None:
        self.grant = max(1, grant)
        self.candidates = (self.grant,) if cores <= self.grant else (self.grant, cores)
        self.trials = trials
        self.seconds: dict[int, list[float]] = {c: [] for c in self.candidates}
        self.warm = False
        self.chosen: int | None = self.grant if len(self.candidates) == 1 else None
        """The thread count kept; None while measuring."""
        self.rounds = 0 if self.chosen is not None else 1
        """Measurements begun: the first, then one each time the choice is measured again
        (none where there is one count)."""
        self._measured_s = 0.0  # this round's timed updates
        self._kept_s = 0.0  # the kept count's updates since it was kept
        self._first: list[float] = []  # its updates in the measurement and WINDOW after
        self._recent: deque[float] = deque(maxlen=WINDOW)  # its latest updates

    def next(self) -> int:
        """The thread count for the next update: the grant first (its update is not timed:
        allocations, a compile), then each candidate in turn, then the chosen one."""
        if self.chosen is not None:
            return self.chosen
        if not self.warm:
            return self.grant
        return min(self.candidates, key=lambda c: len(self.seconds[c]))

    def record(self, threads: int, seconds: float) -> None:
        """One update's wall ``seconds`` at ``threads``; chooses once each count has
        ``trials`` of them, and measures again when the kept count's updates shift
        (:data:`SHIFT`, after :data:`SETTLE`) or after :data:`REVISIT` times as long."""
        if self.chosen is not None:
            self._kept_s += seconds
            if len(self._first) < self._reference_size():
                self._first.append(seconds)
            self._recent.append(seconds)
            if len(self.candidates) > 1 and (self._kept_s >= REVISIT * self._measured_s
                                             or self._shifted()):
                self.seconds = {c: [] for c in self.candidates}
                self.chosen, self._measured_s, self._kept_s = None, 0.0, 0.0
                self.rounds += 1
            return
        if not self.warm:
            self.warm = True
            return
        self.seconds[threads].append(seconds)
        self._measured_s += seconds
        if not all(self.seconds.values()):
            return
        med = self.medians()
        best = min(med, key=med.__getitem__)
        if all(max(self.seconds[best]) <= CLEAR * min(v) for c, v in self.seconds.items()
               if c != best):
            self.chosen = best
        elif all(len(v) >= self.trials for v in self.seconds.values()):
            self.chosen = best if med[best] <= MARGIN * med[self.grant] else self.grant
        if self.chosen is not None:
            self._first, self._recent = list(self.seconds[self.chosen]), deque(maxlen=WINDOW)

    def _reference_size(self) -> int:
        """Updates of the kept count the shift is judged against: its measurement's and
        :data:`WINDOW` after."""
        return len(self.seconds[self.chosen]) + WINDOW if self.chosen is not None else 0

    def _shifted(self) -> bool:
        """Whether the kept count's latest updates moved :data:`SHIFT` from its first ones,
        once it has run :data:`SETTLE` times as long as its measurement."""
        if (self._kept_s < SETTLE * self._measured_s
                or len(self._first) < self._reference_size()):
            return False
        first = statistics.median(self._first)
        return first > 0 and abs(statistics.median(self._recent) / first - 1) > SHIFT

    def medians(self) -> dict[int, float]:
        """The median seconds of each count timed so far."""
        return {c: statistics.median(v) for c, v in self.seconds.items() if v}


class Timed:
    """What :func:`learner_threads` yields: the update's thread count, and whether its time
    counts (the caller clears :attr:`counts` for an update that took no gradient step, as a
    replay learner's before its replay holds ``learning_starts`` transitions)."""

    def __init__(self, threads: int) -> None:
        self.threads = threads
        self.counts = True

    def skip_unless_trained(self, metrics: MutableMapping[str, Any]) -> None:
        """Leave this update's time out when ``metrics`` say it took no gradient step
        (``gradient_steps`` 0; a learner that does not report it always trains)."""
        if metrics.get("gradient_steps", 1) == 0:
            self.counts = False


@contextmanager
def learner_threads(holder: MutableMapping[str, Any], alone: bool, fixed: int = 0
                    ) -> Iterator[Timed]:
    """Run the body (one learner update) with ``fixed`` threads when given (> 0), else with
    the count ``holder``'s :class:`ThreadChoice` picks when the learner works ``alone``,
    else as the task's grant. Yields a :class:`Timed`; the task's count comes back
    afterwards (the rest of the task, a fused rollout, keeps its grant). An update that
    raises, or that the caller marks as not counting, is not a timing.

    Examples
    --------
    >>> holder = {}
    >>> before = torch.get_num_threads()
    >>> with learner_threads(holder, alone=True) as timed:
    ...     timed.threads == before  # the first update runs at the grant
    True
    >>> isinstance(holder["thread_choice"], ThreadChoice), torch.get_num_threads() == before
    (True, True)
    """
    grant = torch.get_num_threads()
    choice = None
    if fixed > 0:
        threads = fixed
    elif not alone:
        threads = grant
    else:
        choice = holder.get("thread_choice")
        if choice is None or choice.grant != grant:  # a new grant (--resources) measures anew
            choice = holder["thread_choice"] = ThreadChoice(grant, usable_cpus())
        threads = choice.next()
    if threads != grant:
        torch.set_num_threads(threads)
    timed = Timed(threads)
    t0 = time.perf_counter()
    try:
        yield timed
        if choice is not None and timed.counts:
            choice.record(threads, time.perf_counter() - t0)
    finally:
        if threads != grant:
            torch.set_num_threads(grant)
