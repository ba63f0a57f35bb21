"""The interface every distribution implements, and helpers for building its tasks."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import dask
from dask.delayed import Delayed, delayed

from ..algorithm import Algorithm, LearnerOutput
from ..failures import Call
from ..fragment import Fragment
from ..graph import Placement
from ..resources import Resources
from ..roles import TaskContext


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

    def context(self, role: str, replica: int) -> TaskContext:
        """The task context of one replica of ``role`` in this iteration."""
        gpu = self.placement.resources[role].gpu if role in self.placement.resources else 0
        return TaskContext(self.run, self.seed, replica, self.iteration, self.num_iterations, gpu,
                           self.deterministic, self.env_retries)


class Distribution(Protocol):
    """Turns an algorithm into one iteration's delayed graph.

    ``fragments`` says which roles it places, with their resources and replica counts;
    ``iteration`` returns a delayed ``LearnerOutput``; its key starts with ``learner``
    (``join`` for a group of piped tasks, whose learner task is keyed ``learner`` too).
    A distribution may also define ``iterations_per_task(inputs)``: how many consecutive
    iterations it can run as one task for this placement (see :func:`iterations_per_task`),
    and ``check_placement(placement, algo)``: its own conditions on a placement, raising
    ``ValueError`` (the driver checks them when it places the fragments, and after a lost
    worker waits for a placement that passes).
    """

    name: str

    def fragments(self, algo: Algorithm) -> list[Fragment]:
        """The fragments it places, for placement and the pre-submit resource check."""

    def iteration(self, inputs: IterationInputs) -> Delayed:
        """The delayed graph of one iteration."""


def iterations_per_task(distribution: Distribution, inputs: IterationInputs) -> int:
    """The most consecutive iterations ``distribution`` can run in one task (1 if it cannot).

    The driver then builds graphs with ``inputs.count`` up to this many: fewer scheduler
    round trips and result fetches per iteration when iterations are short.

    Examples
    --------
    >>> from daskrl.distributions import get_distribution
    >>> inputs = IterationInputs(Algorithm("a", print, print, print, num_steps=8, num_envs=4),
    ...                          Placement({}, {}), "r", 1, 0, 10, None)
    >>> iterations_per_task(get_distribution("data-parallel"), inputs)
    1
    """
    own = getattr(distribution, "iterations_per_task", None)
    return max(1, int(own(inputs))) if callable(own) else 1


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
    return dataclasses.replace(out, history=history[:-1])


def step_key(role: str, replica: int | str, iteration: int, step: int, run: str) -> str:
    """Key of a task inside an iteration, ``<role>-<replica>-it<k>-s<step>-<run>``.

    The dashboard groups it under ``<role>`` like the keys of :func:`daskrl.graph.task_key`.

    Examples
    --------
    >>> step_key("env", "1g0", 3, 5, "1a2b3c4d")
    'env-1g0-it3-s5-1a2b3c4d'
    """
    return f"{role}-{replica}-it{iteration}-s{step}-{run}"


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
        return delayed(Call(fn, key), pure=False)(*args, dask_key_name=key)


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
