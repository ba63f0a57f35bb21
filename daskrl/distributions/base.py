"""The interface every distribution implements, and helpers for building its tasks."""

from __future__ import annotations

import dataclasses
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import dask
from dask.delayed import Delayed, delayed

from daskrl.core.algorithm import CAPABILITIES, Algorithm, LearnerOutput
from daskrl.core.failures import Call
from daskrl.core.fragment import Fragment
from daskrl.core.placement import Placement, task
from daskrl.core.resources import Resources
from daskrl.core.roles import TaskContext, coordinate, without_coordinator_state
from daskrl.core.worker_state import report_progress


@dataclass(frozen=True)
class IterationInputs:
    """What a distribution needs to build iteration ``k``."""

    algo: Algorithm
    placement: Placement
    run: str
    seed: int
    iteration: int
    num_iterations: int
    learner_in: Any  # LearnerOutput, or a Future/Delayed of one
    deterministic: bool = False
    """Bit-identical runs whatever the workers: no fusion, actors rebuilt from their state."""
    env_retries: int = 0
    """Times a rollout whose env raised is retried on rebuilt envs before the error stands."""
    count: int = 1
    """Iterations this graph runs, ``iteration`` to ``iteration + count - 1`` (more than one
    only when the distribution's ``iterations_per_task`` allowed it)."""
    schedule: tuple[int, float] = (0, 0.0)
    """Where the run's schedules go on from (``TaskContext.schedule``)."""
    checkpoint: bool = False
    """The run checkpoints this graph's output: a distribution that keeps run state outside
    the learner (``apex``'s replay shards) puts it into that output's ``state``."""

    def context(self, role: str, replica: int) -> TaskContext:
        """The task context of one replica of ``role`` in this iteration."""
        gpu = self.placement.resources[role].gpu if role in self.placement.resources else 0
        return TaskContext(self.run, self.seed, replica, self.iteration, self.num_iterations, gpu,
                           self.deterministic, self.env_retries, schedule=self.schedule)


class Unsupported(ValueError):
    """A distribution cannot serve an algorithm; the message is one line naming the missing
    capability and a fix."""


class Distribution(ABC):
    """Turns an algorithm into one iteration's delayed graph.

    Every distribution subclasses this and is built per run (its options are its
    constructor's keyword arguments; :func:`~daskrl.distributions.get_distribution`).
    The driver, the CLI and the renderer call these members and nothing else:

    - :meth:`check` refuses an algorithm it cannot serve, before any worker starts;
    - :meth:`fragments` says which roles it places, with their resources and replica counts;
    - :meth:`check_placement` states its own conditions on a placement, and
      :meth:`check_capacity` what the workers' resources must hold;
    - :meth:`iteration` returns a delayed ``LearnerOutput`` whose key starts with
      ``learner`` (``join`` for a group of piped tasks, whose learner task is keyed
      ``learner`` too);
    - :meth:`iterations_per_task`, :meth:`workers_wanted` and :meth:`sketch` size tasks,
      the embedded cluster and the picture of an iteration.

    Examples
    --------
    >>> class Nothing(Distribution):
    ...     name = "nothing"
    ...     def fragments(self, algo): return []
    ...     def iteration(self, inputs): return delayed(None)
    >>> algo = Algorithm("a", print, print, print, num_steps=1, num_actors=3)
    >>> Nothing().check(algo), Nothing().workers_wanted(algo)
    (None, 3)
    """

    name: ClassVar[str]
    """The name users pick it by (``--distribution NAME``)."""
    requires: ClassVar[frozenset[str]] = frozenset()
    """Capabilities (:data:`daskrl.core.algorithm.CAPABILITIES`) every algorithm it runs must
    declare."""
    deterministic: ClassVar[bool] = True
    """Whether ``--deterministic`` runs can be bit-identical under it (False when results
    depend on the order tasks finish)."""
    learner_receives: ClassVar[str] = "batches"
    """What reaches the learner from each actor: ``"batches"`` of transitions, or
    ``"gradients"`` (actors that compute them, as A3C's): the memory estimate counts one
    model-sized gradient per actor instead of the batches."""
    dynamic: ClassVar[bool] = False
    """True when :meth:`iteration` submits tasks as it runs, so that :meth:`sketch` draws a
    static stand-in instead."""
    replaceable: ClassVar[frozenset[str]] = frozenset()
    """Roles whose tasks the distribution moves to another worker itself when theirs is
    lost: losing a worker that hosted only these does not stop the run."""

    switchable: ClassVar[bool] = True
    """Whether a run may switch to or from it between iterations (``--distribution auto``'s
    trials, :mod:`daskrl.runtime.redecide`): the learner output it takes and returns carries
    the learner's whole state. False where part of that state lives elsewhere (Ape-X's
    replay, in shards beside the actors)."""

    serves_coordinator: ClassVar[bool] = False
    """Whether it can run an algorithm with a coordinator
    (:class:`~daskrl.core.contracts.Coordinator`): its actors take each iteration's weights
    from the learner output it is given, and its learner merges the actors' stats with
    :func:`~daskrl.core.roles.merge_stats`, so the coordinator's picks reach the actors and
    the games' outcomes reach the coordinator."""

    headline: ClassVar[tuple[str, ...]] = ()
    """``metrics.csv`` columns whose mean over the run's steady iterations (all but the
    first) ``summary.json`` carries as ``<column>_mean``: the figures a user of this
    distribution looks for first (:meth:`headline_figures`)."""

    def headline_figures(self, columns: Mapping[str, Sequence[float]]) -> dict[str, float]:
        """``summary.json``'s headline figures from the run's metrics columns: the mean of
        each :attr:`headline` column over the iterations after the first (the first carries
        the start-up), NaN cells left out; a column the run never wrote is left out.

        Examples
        --------
        >>> class Lagging(Distribution):
        ...     name, headline = "lagging", ("policy_lag",)
        ...     def fragments(self, algo): return []
        ...     def iteration(self, inputs): return None
        >>> Lagging().headline_figures({"policy_lag": [9.0, 1.0, 2.0, float("nan")]})
        {'policy_lag_mean': 1.5}
        """
        out = {}
        for column in self.headline:
            values = [v for v in list(columns.get(column) or [])[1:] if not math.isnan(v)]
            if values:
                out[f"{column}_mean"] = sum(values) / len(values)
        return out

    def required(self, algo: Algorithm) -> dict[str, str]:
        """The capabilities it needs of ``algo`` with these options, each with the fix to
        suggest when it is missing (default: :attr:`requires`)."""
        fix = ("pick another --distribution, or declare it in the graph's build() once its "
               "actor and learner offer it")
        return {cap: fix for cap in self.requires}

    def check(self, algo: Algorithm) -> None:
        """Raise :class:`Unsupported` (one line: the missing capability and a fix) when it
        cannot serve ``algo``; called before any worker starts."""
        if algo.make_coordinator is not None and not self.serves_coordinator:
            raise Unsupported(
                f"the {self.name!r} distribution cannot run {algo.name!r}, which has a "
                "coordinator (its actors would not see the coordinator's picks): use "
                "--distribution actors-learner or single")
        for cap, fix in sorted(self.required(algo).items()):
            if cap not in algo.capabilities:
                raise Unsupported(
                    f"the {self.name!r} distribution needs the {cap!r} capability, which "
                    f"{algo.name!r} does not declare ({CAPABILITIES[cap]}): {fix}")

    @abstractmethod
    def fragments(self, algo: Algorithm) -> list[Fragment]:
        """The fragments it places, for placement and the pre-submit resource check."""

    @abstractmethod
    def iteration(self, inputs: IterationInputs) -> Delayed:
        """The delayed graph of one iteration (``inputs.count`` iterations)."""

    def check_placement(self, placement: Placement, algo: Algorithm) -> None:
        """Raise ``ValueError`` when ``placement`` breaks its own conditions (default: none).

        The driver calls it when it places the fragments, and after a lost worker waits for
        a placement that passes."""
        return None

    def check_capacity(self, placement: Placement, workers: Mapping[str, Mapping[str, float]],
                       algo: Algorithm) -> None:
        """Raise ``ValueError`` (one line: the numbers and a fix) when ``workers`` (name ->
        advertised resources) cannot hold what ``placement`` puts on them at once (default:
        no condition). Called where :meth:`check_placement` is, before any task starts."""
        return None

    def iterations_per_task(self, inputs: IterationInputs) -> int:
        """The most consecutive iterations it can run as one task for this placement
        (default 1). The driver then builds graphs with ``inputs.count`` up to this many:
        fewer scheduler round trips and result fetches per iteration when iterations are
        short."""
        return 1

    def task_floor_s(self, algo: Algorithm, hop_s: float) -> float:
        """A lower bound on one iteration's wall time from Dask's cost per task alone, where
        a task that waits on another's result costs ``hop_s`` (measured on the cluster): the
        longest chain of dependent tasks in an iteration, times ``hop_s``. Default 0 (a few
        tasks an iteration); distributions with a task per env step or per gradient step say
        theirs, so ``--distribution auto`` skips them when they cannot win.

        Examples
        --------
        >>> algo = Algorithm("a", print, print, print, num_steps=128)
        >>> from daskrl.distributions import get_distribution
        >>> get_distribution("actors-learner").task_floor_s(algo, 0.002)
        0.0
        >>> get_distribution("central-inference").task_floor_s(algo, 0.002)
        0.512
        """
        return 0.0

    def workers_wanted(self, algo: Algorithm) -> int:
        """Workers the embedded cluster starts for ``algo`` (default: one per actor)."""
        return algo.num_actors

    def sketch(self, inputs: IterationInputs) -> Delayed:
        """The graph :mod:`daskrl.observe.render` draws (default: :meth:`iteration`'s)."""
        return self.iteration(inputs)


def coordinated(inputs: IterationInputs, graph: Delayed, previous: Any) -> Delayed:
    """``graph`` (one iteration) followed by the algorithm's coordinator task, on the worker
    placed for role ``coordinator``; the coordinator carries its state from ``previous`` (the
    last coordinated output, whole) to the new output (:func:`daskrl.core.roles.coordinate`)."""
    place = inputs.placement
    return task(coordinate, inputs.context("coordinator", 0), inputs.algo, previous, graph,
                role="coordinator", replica=0, iteration=inputs.iteration, run=inputs.run,
                resources=place.resources["coordinator"], worker=place.worker("coordinator", 0))


def lightened(inputs: IterationInputs, coordinated_output: Any) -> Delayed:
    """The coordinated output without the coordinator's state, as the next iteration's actors
    and learner take it (they need only the picks in its weights): a league's snapshots stay
    on the coordinator's worker instead of travelling to every task (key replica 1)."""
    place = inputs.placement
    return task(without_coordinator_state, coordinated_output, role="coordinator", replica=1,
                iteration=inputs.iteration, run=inputs.run,
                resources=place.resources["coordinator"], worker=place.worker("coordinator", 0))


def iterations_per_task(distribution: Distribution, inputs: IterationInputs) -> int:
    """``distribution.iterations_per_task(inputs)``, at least 1.

    Examples
    --------
    >>> from daskrl.distributions import get_distribution
    >>> inputs = IterationInputs(Algorithm("a", print, print, print, num_steps=8, num_envs=4),
    ...                          Placement({}, {}), "r", 1, 0, 10, None)
    >>> iterations_per_task(get_distribution("data-parallel"), inputs)
    1
    """
    return max(1, int(distribution.iterations_per_task(inputs)))


def chained(ctx: TaskContext, learner_in: LearnerOutput, count: int,
            one: Callable[[TaskContext, LearnerOutput], LearnerOutput]) -> LearnerOutput:
    """Run ``count`` iterations in this task: ``one(ctx, learner_in)`` for iterations
    ``ctx.iteration, ctx.iteration + 1, ...``, each taking the previous one's output.

    Returns the last output with the earlier iterations' metrics in ``history``.

    Examples
    --------
    >>> def one(ctx, out):
    ...     return LearnerOutput(out.version + 1, {}, {}, {"it": ctx.iteration})
    >>> out = chained(TaskContext("r", 1, 0, 5, 9), LearnerOutput(5, {}, {}), 3, one)
    >>> out.version, out.metrics, out.history
    (8, {'it': 7}, [{'it': 5}, {'it': 6}])
    """
    out, history = learner_in, []
    for j in range(count):
        out = one(dataclasses.replace(ctx, iteration=ctx.iteration + j), out)
        history.append(out.metrics)
        if j < count - 1:
            report_progress()  # the watchdog bounds each iteration, not the whole task
    return dataclasses.replace(out, history=history[:-1])


def pinned(fn: Callable[..., Any], *args: Any, key: str, resources: Resources,
           worker: str | None, strict: bool = True) -> Delayed:
    """A delayed call with its key, resources and worker pin.

    ``strict=True`` pins it to ``worker`` only: used for tasks in the middle of a chain
    whose state (an env half-way through a rollout, an update half-way through its
    minibatches) lives on that worker and cannot move. If that worker is lost, the task
    fails after ``distributed.scheduler.no-workers-timeout`` and the run resumes from its
    last checkpoint.

    Examples
    --------
    >>> d = pinned(max, 1, 2, key="x-0-it0-s0-r", resources=Resources(cpu=1), worker=None)
    >>> d.compute(scheduler="sync")
    2
    """
    annotations: dict[str, Any] = {"resources": resources.to_dask()}
    if worker is not None:
        annotations.update(workers=[worker], allow_other_workers=not strict)
    with dask.annotate(**annotations):
        return delayed(Call(fn, key, resources.threads), pure=False)(*args, dask_key_name=key)


def parse_spec(spec: str) -> tuple[str, dict[str, str]]:
    """Split ``NAME[:KEY=VALUE[,KEY=VALUE]]`` into the name and its options.

    Examples
    --------
    >>> parse_spec("data-parallel:allreduce=torch")
    ('data-parallel', {'allreduce': 'torch'})
    """
    name, _, rest = spec.partition(":")
    options: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in rest.split(","))):
        key, sep, value = part.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"malformed distribution option {part!r} in {spec!r}: write "
                             "NAME:KEY=VALUE, e.g. data-parallel:allreduce=torch")
        options[key.strip().replace("-", "_")] = value.strip()
    return name.strip(), options


def to_int(name: str, value: int | str, minimum: int = 1) -> int:
    """An integer option, checked; the error names the option.

    Examples
    --------
    >>> to_int("env_groups", "2")
    2
    """
    try:
        out = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"option {name}={value!r} must be an integer") from None
    if out < minimum:
        raise ValueError(f"option {name}={value!r} must be >= {minimum}")
    return out


def to_bool(name: str, value: bool | str) -> bool:
    """A boolean option (``true/false/1/0/yes/no``).

    Examples
    --------
    >>> to_bool("fuse", "no")
    False
    """
    if isinstance(value, bool):
        return value
    text = str(value).lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"option {name}={value!r} must be true or false")
