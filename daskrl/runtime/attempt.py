"""One placement of a run's fragments, how it is lost, and how iterations are grouped.

A run goes on as a series of :class:`Attempt`\\ s: the fragments placed (:func:`place`) and
their workers pinned; when a pinned worker leaves (:class:`WorkersLost`), a task hangs
(:class:`WorkerHung`) or Dask gives a task up (:data:`LOST`), the run loop places the
fragments again and goes on under a new attempt. :class:`TaskSize` groups iterations into
tasks of about ``--task-s`` seconds.
"""

from __future__ import annotations

import uuid
from concurrent.futures import CancelledError
from dataclasses import dataclass

from distributed.client import FutureCancelledError
from distributed.scheduler import KilledWorker, NoValidWorkerError, NoWorkerError

from daskrl.core import roles
from daskrl.core.algorithm import Algorithm
from daskrl.core.failures import PeerLost
from daskrl.core.fragment import Fragment
from daskrl.core.placement import Placement, plan_placement
from daskrl.distributions import Distribution, IterationInputs
from daskrl.runtime.engine import Backend, Handle
from daskrl.runtime.occupancy import place_claimed
from daskrl.runtime.settings import RunSettings


class WorkersLost(RuntimeError):
    """A worker that replicas are pinned to has left the cluster."""


class ClusterLost(ValueError):
    """No worker that can host the fragments came back in time (``--max-restarts`` starts
    a new embedded cluster; otherwise the run stops with this one line)."""


class WorkerHung(RuntimeError):
    """The watchdog found a task past its bound or a silent worker, and restarted it."""


LOST = (CancelledError, FutureCancelledError, KilledWorker, NoValidWorkerError, NoWorkerError,
         PeerLost, WorkersLost, WorkerHung)
"""What a lost worker looks like to the driver: the iteration is submitted again."""


def place(backend: Backend, algo: Algorithm, distribution: Distribution,
          token: str | None = None) -> Placement:
    """Check every fragment's resources against the workers and pin replicas to names.

    ``token`` names the run: its placement prefers workers that other runs training from
    this process hold fewer replicas on (:mod:`daskrl.runtime.occupancy`).

    Raises ``ValueError`` when the workers cannot host the fragments, or when the
    distribution's own conditions (``check_placement``) refuse the placement.

    Examples
    --------
    >>> from daskrl.runtime.sync_backend import SyncBackend
    >>> from daskrl.distributions import get_distribution
    >>> algo = Algorithm("a", print, print, print, num_steps=8, num_envs=4)
    >>> place(SyncBackend(), algo, get_distribution("single")).worker("learner", 0)
    'local'
    """
    fragments = distribution.fragments(algo)
    if "evaluate" not in {f.role for f in fragments}:
        fragments.append(Fragment(roles.evaluate, "evaluate", algo.resources_for("evaluate")))
    if algo.make_coordinator is not None:
        fragments.append(Fragment(roles.coordinate, "coordinator",
                                  algo.resources_for("coordinator")))
    offered = backend.workers(fragments)
    if token is None or backend.name == "sync":
        placement = plan_placement(fragments, offered)
    else:
        placement = place_claimed(token, lambda busy: plan_placement(fragments, offered, busy))
    distribution.check_placement(placement, algo)
    if backend.name != "sync":  # one process running every task in turn holds nothing at once
        distribution.check_capacity(placement, offered, algo)
    return placement


@dataclass(frozen=True)
class InFlight:
    """A submitted graph: iterations ``first`` to ``first + count - 1``."""

    first: int
    count: int
    handle: Handle
    full: Handle | None = None
    """With a coordinator: the output with the coordinator's state (``handle``'s is without
    it)."""
    fetch_full: bool = False
    """Whether the driver fetches ``full`` rather than ``handle``: for an iteration it
    checkpoints, and the run's last."""


@dataclass(frozen=True)
class Attempt:
    """One placement of the run's fragments and the task keys submitted under it.

    After a lost worker the run goes on as a new attempt: new task keys, because a key
    reused right after its cancellation can be cancelled by the scheduler's late notice,
    and fresh worker state, because what the lost attempt left half-way through an
    iteration must not be used.
    """

    run: str
    """The id that ends every task key (and names worker state) of this attempt."""
    placement: Placement
    pins: dict[str, str]
    """Worker name -> its address at placement. The scheduler resolves a name pin to an
    address, so a worker restarted under its name is lost to the tasks pinned before."""
    since: int
    """The backend's membership cursor when the pins were taken."""
    cap: int
    """The most iterations one task may run under this placement."""

    @classmethod
    def begin(cls, backend: Backend, algo: Algorithm, distribution: Distribution,
              placement: Placement, settings: RunSettings) -> Attempt:
        """Pin ``placement``'s workers as they are now, under a new run id."""
        since = backend.membership.cursor()  # before the snapshot: no departure slips by
        now = backend.identities()
        names = {name for role, names in placement.workers.items()
                 if role not in distribution.replaceable for name in names}
        cap = 1
        if settings.task_s > 0 and algo.make_coordinator is None:  # a coordinator: one each
            probe = IterationInputs(algo, placement, "", settings.seed, 0, 1, None,
                                    settings.deterministic, settings.env_retries)
            cap = max(1, int(distribution.iterations_per_task(probe)))
        return cls(uuid.uuid4().hex[:8], placement, {name: now.get(name, "") for name in names},
                   since, cap)

    def lost_workers(self, backend: Backend) -> list[str]:
        """Names of the pinned workers that left since the pins were taken."""
        left = backend.membership.left_since(self.since)
        return sorted(name for name, addr in self.pins.items() if not addr or addr in left)


class TaskSize:
    """How many iterations go into one task.

    One until a task has been timed (and then one task in flight, since the next ones are
    sized from it); after that, about ``task_s`` seconds of work, at most ``cap``.

    Examples
    --------
    >>> size = TaskSize(cap=8, task_s=0.5)
    >>> size.count, size.window(4)
    (1, 1)
    >>> size.observe(0.125)
    >>> size.count, size.window(4)
    (4, 4)
    """

    def __init__(self, cap: int, task_s: float) -> None:
        self.cap, self.task_s = cap, task_s
        self.count = 1
        self.timed = cap <= 1

    def window(self, depth: int) -> int:
        """How many tasks may be in flight."""
        return depth if self.timed else 1

    def observe(self, per_iteration: float) -> None:
        """Size the next tasks from the seconds an iteration took."""
        if self.cap > 1 and per_iteration > 0:
            self.count = max(1, min(self.cap, int(self.task_s / per_iteration)))
            self.timed = True
