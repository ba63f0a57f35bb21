"""``daskrl sweep`` and :func:`sweep`: many runs of one graph on one Dask cluster.

Seeds of one configuration, a grid of configurations, a search by Optuna, or a
population trained by population-based training: each trial is a :func:`daskrl.train`
run in ``OUT/<trial>/`` with the usual files, at most ``concurrency`` at once, sharing
the cluster's workers (each run's resources respected: a task runs where its role's
resources are offered). ``OUT/sweep.json`` records every trial; ``OUT/report.*`` the
results (:mod:`daskrl.sweeps.report`). ``resume=True`` keeps finished trials and trains
the others on from their checkpoints.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from distributed import Client

from daskrl.api import algorithm_of, keyword_words
from daskrl.cluster.local import close_cluster, default_worker_resources, local_cluster
from daskrl.core.scheduler_workers import scheduler_workers
from daskrl.core.script import load_graph
from daskrl.sweeps.pbt import Population, check_mid_run
from daskrl.sweeps.report import bootstrap_reps, report, rliable_modules
from daskrl.sweeps.runner import Job, Launch, TrialPool
from daskrl.sweeps.search import (
    PRUNERS,
    SAMPLERS,
    Search,
    eval_interval,
    open_study,
    optuna_module,
)
from daskrl.sweeps.spec import Dimension, Trial, grid_trials, parse_dimension
from daskrl.sweeps.state import DONE, SweepState

MODES = ("seeds", "grid", "search", "pbt")


@dataclass
class SweepResult:
    """What a sweep produced: its folder, every trial's record and the report."""

    out: Path
    trials: dict[str, dict[str, Any]]
    """Trial name -> ``config``, ``seed``, ``state``, ``eval_return_mean``, ``wall_s``..."""
    report: dict[str, Any]
    """``report.json``: per configuration the IQM and its interval, cost, states."""

    @property
    def best(self) -> dict[str, Any] | None:
        """The configuration with the highest IQM (its ``report`` row)."""
        rows = [r for r in self.report["configurations"] if "iqm" in r]
        return max(rows, key=lambda r: r["iqm"]) if rows else None


def config_kinds(config_cls: type) -> dict[str, type]:
    """Each ``Config`` field's type, as ``--space`` reads values for it."""
    hints = typing.get_type_hints(config_cls)
    return {f.name: hints.get(f.name, str) for f in dataclasses.fields(config_cls) if f.init}


def sweep(graph: str | os.PathLike, *, out: str | os.PathLike, seeds: int | Sequence[int] = 1,
          seed: int = 1, grid: Mapping[str, Sequence[Any]] | None = None,
          search: str | None = None, trials: int = 20,
          enqueue: Sequence[Mapping[str, Any]] = (),
          space: Sequence[str | Dimension] | None = None, sampler: str = "tpe",
          pruner: str = "median", pbt: bool = False, population: int = 8,
          interval: int | None = None, quantile: float = 0.25,
          start: Sequence[Mapping[str, Any]] = (),
          concurrency: int | None = None, client: Client | None = None,
          workers: int | None = None, steps: int = 500_000, resume: bool = False,
          progress: bool = True, distribution: str | None = None, eval_every: int = 0,
          checkpoint_every: int = 10, deterministic: bool = False,
          resources: Mapping[str, str] | None = None, **config: Any) -> SweepResult:
    """Train many runs of ``graph`` on one cluster and report them as RL papers do.

    Parameters
    ----------
    graph : path
        A graph script, e.g. ``"graphs/ppo.py"``.
    out : path
        The sweep's folder: ``sweep.json``, ``report.*`` and one folder per trial.
    seeds : int or sequence of int
        Seeds of each configuration (an int N: ``seed`` to ``seed + N - 1``).
    seed : int
        The first seed (and the seed of the search's sampler and of PBT's draws).
    grid : mapping, optional
        ``Config`` field -> values: every combination is trained with every seed.
    search : "optuna", optional
        Propose ``trials`` configurations from ``space`` with Optuna's ``sampler``
        (``"tpe"`` or ``"random"``), pruning with ``pruner`` (``"median"``: a trial whose
        periodic evaluation falls below the median of earlier trials at that iteration is
        stopped; ``"none"``). One seed per trial.
    trials : int
        Trials of a search.
    enqueue : sequence of dict
        Configurations a search tries first, in order (e.g. the graph's defaults).
    space : sequence, optional
        What a search or PBT draws: ``"KEY=LOW:HIGH[:log]"`` or ``"KEY=V1,V2"`` strings, or
        :class:`~daskrl.sweeps.spec.Dimension` s.
    pbt : bool
        Population-based training of ``population`` members over ``space`` (the graph's
        ``Config.MID_RUN`` settings only): every ``interval`` iterations (default: a tenth
        of the run) the bottom ``quantile`` copies a top member's checkpoint and perturbs
        its settings (:mod:`daskrl.sweeps.pbt`). ``start``: the members' first settings,
        cycled (default: draws from ``space``).
    concurrency : int, optional
        Trials training at once (default: twice the cluster's workers, so one run's
        rollout and another's update fill the cores together).
    client : distributed.Client, optional
        The cluster; None: an embedded one with ``workers`` workers (default: one per core).
    steps, distribution, eval_every, checkpoint_every, deterministic, resources
        Each trial's :func:`daskrl.train` settings.
    resume : bool
        Continue the sweep in ``out``: finished, failed and pruned trials are kept, the
        others train on from their checkpoints (or from the start without one).
    progress : bool
        One progress bar over the trials.
    **config
        ``Config`` fields every trial shares.

    Returns
    -------
    SweepResult

    Raises
    ------
    ValueError
        One line naming a bad setting, before anything trains.

    Examples
    --------
    >>> sweep("graphs/ppo.py", out="runs/s", grid={"learning_rate": [1e-3]}, pbt=True)
    Traceback (most recent call last):
    ...
    ValueError: choose one of grid, search and pbt
    >>> result = sweep("graphs/ppo.py", out="runs/seeds", seeds=3, steps=20_000,
    ...                num_envs=4)  # doctest: +SKIP
    >>> result.report["configurations"][0]["iqm"]  # doctest: +SKIP
    """
    mode = _mode(grid, search, pbt)
    seed_list = list(range(seed, seed + seeds)) if isinstance(seeds, int) else list(seeds)
    if not seed_list or (isinstance(seeds, int) and seeds < 1):
        raise ValueError(f"seeds must be >= 1, got {seeds}")
    if mode in ("search", "pbt") and len(seed_list) > 1:
        raise ValueError(f"{'search' if mode == 'search' else 'pbt'} trials use one seed each; "
                         "train the best configuration again with grid=... and seeds=N")
    if concurrency is not None and concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    module = load_graph(str(graph))
    kinds = config_kinds(module.Config)
    unknown = sorted(set(grid or {}) - set(kinds))
    if unknown:
        raise ValueError(f"grid: the graph's Config has no field(s) {unknown}; it has "
                         f"{sorted(kinds)}")
    dims = [d if isinstance(d, Dimension) else parse_dimension(d, kinds) for d in space or ()]
    algo, _, _ = algorithm_of(str(graph), dict(config))  # every shared setting checked now
    iterations = max(1, math.ceil(steps / algo.steps_per_iteration))
    rliable_modules()  # the report needs it: say so before anything trains
    bootstrap_reps()  # a bad $DASKRL_BOOTSTRAP_REPS, too
    options: dict[str, Any] = {"distribution": distribution, "checkpoint_every": checkpoint_every,
                               "deterministic": deterministic, "eval_every": eval_every,
                               "resources": dict(resources or {})}
    definition: dict[str, Any] = {"graph": str(Path(graph).resolve()), "mode": mode,
                                  "steps": steps, "config": dict(config),
                                  "iterations": iterations, **options}
    if mode != "pbt" and start:
        raise ValueError("start gives the first settings of pbt's members: add pbt=True")
    if mode in ("seeds", "grid"):
        if dims:
            raise ValueError("space is what search or pbt draws from: add search='optuna' or "
                             "pbt=True, or give the values as grid=")
        definition.update(seeds=seed_list, grid={k: list(v) for k, v in (grid or {}).items()})
    elif mode == "search":
        if search != "optuna":
            raise ValueError(f"search={search!r}: the search is 'optuna'")
        _choice("sampler", sampler, SAMPLERS)
        _choice("pruner", pruner, PRUNERS)
        if not dims:
            raise ValueError("search needs a space: e.g. space=['learning_rate=1e-4:1e-2:log']")
        if trials < 1:
            raise ValueError(f"trials must be >= 1, got {trials}")
        optuna_module()
        options["eval_every"] = eval_interval(eval_every, iterations, pruner)
        definition.update(space=[dataclasses.asdict(d) for d in dims], trials=trials,
                          sampler=sampler, pruner=pruner, seed=seed_list[0],
                          enqueue=[dict(e) for e in enqueue],
                          eval_every=options["eval_every"])
    else:
        check_mid_run(module.Config, dims)
        if not dims:
            raise ValueError("pbt needs a space: e.g. space=['learning_rate=1e-5:1e-2:log']")
        if population < 2:
            raise ValueError(f"population must be >= 2, got {population}")
        if not 0 < quantile <= 0.5:
            raise ValueError(f"quantile must be in (0, 0.5], got {quantile}")
        interval = interval or max(1, iterations // 10)
        if interval < 1 or interval >= iterations:
            raise ValueError(f"interval must be >= 1 and below the run's {iterations} "
                             f"iterations, got {interval}")
        names = {d.name for d in dims}
        outside = sorted({k for config in start for k in config} - names)
        if outside:
            raise ValueError(f"pbt start settings {outside} are not in the space "
                             f"{sorted(names)}")
        definition.update(space=[dataclasses.asdict(d) for d in dims], population=population,
                          interval=interval, quantile=quantile, seed=seed_list[0],
                          start=[dict(c) for c in start])
    try:
        state = SweepState(Path(out), definition, resume)
    except ValueError as exc:
        raise ValueError(keyword_words(str(exc))) from None
    owned = None
    if client is None:
        count = workers or os.cpu_count() or 1
        cluster = local_cluster(default_worker_resources(count))
        client = Client(cluster)
        owned = (client, cluster)
    launch = Launch(str(graph), steps, dict(config), options)
    width = concurrency or 2 * max(1, len(scheduler_workers(client)))
    started = time.monotonic()
    earlier = float(state.data.get("wall_s", 0.0))
    try:
        if mode in ("seeds", "grid"):
            planned = grid_trials(grid or {}, seed_list)
            for trial in planned:
                state.add(trial.name, trial.config, trial.seed)
            pool = TrialPool(client, launch, state, width, progress, len(planned), mode)
            pool.run(iter([Job(t) for t in planned
                           if state.trials[t.name]["state"] not in DONE]))
        elif mode == "search":
            study = open_study(state.out, sampler, pruner, seed_list[0],
                               startup=min(5, max(1, trials // 4)))
            searcher = Search(study, dims, trials, seed_list[0], state, enqueue)
            pool = TrialPool(client, launch, state, width, progress, trials, mode)
            pool.run(searcher.jobs(), watch=lambda job: searcher.watch(pool, job),
                     ended=searcher.ended)
            state.set("best", searcher.best())
        else:
            assert interval is not None
            members = Population(state, dims, population, interval, iterations,
                                 seed_list[0], quantile, start)
            pool = TrialPool(client, launch, state, width, progress,
                             population * members.rounds, mode)
            members.train(pool)
        pool.close()
    finally:
        state.set("wall_s", earlier + time.monotonic() - started)
        if owned is not None:
            owned[0].close()
            close_cluster(owned[1])
    result = report(state.out, state.data, state.data["wall_s"])
    return SweepResult(state.out, state.trials, result)


def _mode(grid: Any, search: str | None, pbt: bool) -> str:
    chosen = [name for name, on in (("grid", bool(grid)), ("search", search is not None),
                                    ("pbt", pbt)) if on]
    if len(chosen) > 1:
        raise ValueError("choose one of grid, search and pbt")
    return chosen[0] if chosen else "seeds"


def _choice(name: str, value: str, allowed: Sequence[str]) -> None:
    if value not in allowed:
        raise ValueError(f"{name}={value!r}: choose one of {', '.join(allowed)}")


__all__ = ["MODES", "SweepResult", "Trial", "sweep"]
