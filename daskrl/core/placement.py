"""Building blocks of an iteration's delayed graph: readable keys, annotations, placement."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import dask
from dask.delayed import Delayed, delayed

from daskrl.core.failures import Call
from daskrl.core.fragment import Fragment
from daskrl.core.keys import task_key
from daskrl.core.resources import Resources


def task(
    fn: Callable[..., Any],
    *args: Any,
    role: str,
    replica: int,
    iteration: int,
    run: str,
    resources: Resources,
    worker: str | None = None,
) -> Delayed:
    """One fragment call as a delayed task with its key, resources and worker preference.

    ``worker`` pins the task to a worker *name* (names survive restarts), so the replica stays
    where its state lives and is not stolen away from it. The pin is strict: a loose one
    would also relax the resource restriction. When a pinned worker leaves, the driver
    plans placement again and resubmits. Earlier iterations take precedence: of two tasks
    ready on a worker at once, the one of the earlier iteration runs first. The task runs
    torch and BLAS with as many threads as its CPU grant (:attr:`Resources.threads`), on any
    worker and in ``--scheduler sync``.

    Examples
    --------
    >>> d = task(max, 1, 2, role="learner", replica=0, iteration=0, run="r",
    ...          resources=Resources(cpu=1))
    >>> d.key, d.compute(scheduler="sync")
    ('learner-0-it0-r', 2)
    """
    annotations: dict[str, Any] = {"resources": resources.to_dask(), "priority": -iteration}
    if worker is not None:
        annotations.update(workers=[worker])
    key = task_key(role, replica, iteration, run)
    with dask.annotate(**annotations):
        return delayed(Call(fn, key, resources.threads), pure=False)(*args, dask_key_name=key)


@dataclass(frozen=True)
class Placement:
    """Resolved resources and the worker name of every replica of every role."""

    resources: Mapping[str, Resources]
    workers: Mapping[str, tuple[str, ...]]

    def worker(self, role: str, replica: int) -> str | None:
        """The preferred worker of one replica (None when the role has no plan)."""
        names = self.workers.get(role, ())
        return names[replica % len(names)] if names else None


def plan_placement(
    fragments: Sequence[Fragment],
    workers: Mapping[str, Mapping[str, float]],
    busy: Mapping[str, int] | None = None,
) -> Placement:
    """Assign each fragment's replicas to workers that offer its resources.

    Roles that need a GPU take GPU workers; other roles prefer workers without one, so a
    learner's GPU worker is not also stepping envs. A fragment's ``apart_from`` roles'
    workers are avoided when others fit. Replicas are spread round-robin.

    ``CPU`` is a Dask resource only where some worker declares it. On a cluster where no
    worker does (a plain ``LocalCluster()`` or ``dask worker``), every worker can host CPU
    fragments and their tasks are annotated without ``CPU`` (Dask restricts a task that
    names a resource to the workers that advertise it): Dask runs them one per thread, as
    any task. GPUs and custom resources are asked for as declared, and a fragment that no
    worker can host (a GPU-only learner without a GPU worker) is refused.

    Parameters
    ----------
    fragments : sequence of Fragment
        One per role, with its resources and replica count.
    workers : mapping of worker name to its advertised resources
    busy : mapping of worker name to a count, optional
        Replicas other runs hold on each worker: among the workers that fit, the less busy
        come first (:mod:`daskrl.runtime.occupancy`); None: by name.

    Raises
    ------
    ValueError
        Naming the role and the resource when no worker offers it (nor its fallback).

    Examples
    --------
    >>> frags = [Fragment(print, "rollout", Resources(cpu=1), 2),
    ...          Fragment(print, "learner", Resources(gpu=1))]
    >>> p = plan_placement(frags, {"a": {"CPU": 1}, "b": {"CPU": 1, "GPU": 1}})
    >>> p.workers["rollout"], p.workers["learner"]
    (('a', 'a'), ('b',))
    >>> plain = plan_placement(frags[:1], {"a": {}, "b": {}})  # no worker declares CPU
    >>> plain.workers["rollout"], plain.resources["rollout"].to_dask()
    (('a', 'b'), {})
    """
    if not workers:
        raise ValueError("the cluster has no workers: start some, or use the embedded cluster")
    resolved: dict[str, Resources] = {}
    chosen: dict[str, tuple[str, ...]] = {}
    offered = "; ".join(f"{n}: {dict(r) or 'no resources'}" for n, r in sorted(workers.items()))
    cpu_declared = any("CPU" in r for r in workers.values())
    if not cpu_declared:  # CPU is no Dask resource here: every worker has CPUs
        workers = {n: {**r, "CPU": math.inf} for n, r in workers.items()}
    for frag in fragments:
        role, res, replicas = frag.role, frag.resources, frag.replicas
        try:
            use = res.resolve(workers)
        except ValueError:
            raise ValueError(
                f"fragment {role!r} needs {res}, which no worker offers (workers: {offered}); "
                f"start a worker with `dask worker --resources \"KEY=N\"`, or change the "
                f"fragment's resources with --resources {role}=KEY:N"
            ) from None
        fits = sorted((n for n, r in workers.items() if use.satisfied_by(r)),
                      key=lambda n: ((busy or {}).get(n, 0), n))
        if not use.gpu:
            no_gpu = [n for n in fits if not workers[n].get("GPU")]
            fits = no_gpu or fits
        avoid = {n for other in frag.apart_from for n in chosen.get(other, ())}
        fits = [n for n in fits if n not in avoid] or fits
        resolved[role] = use if cpu_declared else Resources(gpu=use.gpu, custom=use.custom)
        chosen[role] = tuple(fits[i % len(fits)] for i in range(replicas))
    return Placement(resolved, chosen)
