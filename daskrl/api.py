"""Training from Python: :func:`train` a graph script or an algorithm on any Dask cluster.

``daskrl.train("graphs/ppo.py", client=client, steps=100_000, num_envs=8)`` runs the same
loop as ``daskrl train`` (placement, memory check, checkpoints, ``metrics.csv``,
``summary.json``), on the user's ``Client`` or on an embedded cluster, and returns a
:class:`Run`. With ``wait=False`` it returns at once: the run trains in a background
thread while a notebook goes on, and :meth:`Run.stop` ends it with a checkpoint.
"""

from __future__ import annotations

import csv
import dataclasses
import os
import re
import threading
import time
import types
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from distributed import Client, Scheduler, SpecCluster

from daskrl.cluster.elastic import Elastic, plan
from daskrl.cluster.elastic import adapt as start_adapting
from daskrl.cluster.local import (
    close_cluster,
    default_worker_resources,
    local_cluster,
    scale_like,
)
from daskrl.core.algorithm import Algorithm
from daskrl.core.failures import StopAsked
from daskrl.core.resources import Resources, parse_role_resources
from daskrl.core.script import MissingExtra, load_graph
from daskrl.distributions import Distribution, auto_redecides, get_distribution, is_auto
from daskrl.observe.metrics import write_summary
from daskrl.runtime.auto import refuse_deterministic, resolve, sizing
from daskrl.runtime.dask_backend import DaskBackend
from daskrl.runtime.driver import RunSettings, check_distribution, check_settings
from daskrl.runtime.driver import train as train_run
from daskrl.runtime.engine import Handle


class StopRequested(StopAsked):
    """Raised inside a run that :meth:`Run.stop` ends (after its checkpoint is written)."""


class _StoppableBackend(DaskBackend):
    """The Dask backend, which ends the run when asked: the driver waits on :meth:`done`
    at least once a second, and on an exception checkpoints the last finished iteration."""

    def __init__(self, client: Client, stop: threading.Event,
                 scheduler: Scheduler | None = None) -> None:
        super().__init__(client, scheduler=scheduler)
        self.stop = stop

    def _check(self) -> None:
        if self.stop.is_set():
            raise StopRequested("stopped from Python (Run.stop)")

    def done(self, handle: Handle, timeout: float) -> bool:
        """As the Dask backend's, unless a stop was asked for."""
        self._check()
        return super().done(handle, timeout)

    def submit(self, graph: Any) -> Handle:
        """As the Dask backend's, unless a stop was asked for (before the first iteration,
        or between the last one and the evaluation)."""
        self._check()
        return super().submit(graph)


class Run:
    """One training run: its folder, its state, and what it produced.

    ``status`` is ``"running"``, ``"finished"``, ``"stopped"`` or ``"failed"``. A finished
    or stopped run's policy and metrics are read from its folder (``out``).
    """

    def __init__(self, out: Path, steps: int, client: Client,
                 owned: tuple[Client, SpecCluster] | tuple[()] = ()) -> None:
        self.out = out
        self.steps = steps
        self.client = client
        self.error: BaseException | None = None
        self._owned = owned  # an embedded cluster and its client: closed when the run ends
        self._summary: dict[str, Any] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _start(self, work: Callable[[Any], dict[str, Any]], wait: bool) -> Run:
        # an embedded cluster's scheduler runs here: its stop is seen at once
        backend = _StoppableBackend(self.client, self._stop,
                                    scheduler=self._owned[1].scheduler if self._owned else None)
        self._thread = threading.Thread(target=self._train, args=(work, backend),
                                        name="daskrl-train", daemon=True)
        self._thread.start()
        if not wait:
            return self
        try:
            return self.result()
        except KeyboardInterrupt:  # Ctrl-C (a notebook's interrupt): stop with a checkpoint
            self.stop()
            raise

    def _train(self, work: Callable[[Any], dict[str, Any]], backend: Any) -> None:
        try:
            self._summary = work(backend)
        except BaseException as exc:  # noqa: BLE001 - kept for result()
            self.error = exc
        finally:
            if self._owned:
                client, cluster = self._owned
                client.close()
                close_cluster(cluster)  # without waiting 30 s for a scheduler that is gone

    @property
    def status(self) -> str:
        """``running``, ``finished``, ``stopped`` or ``failed``."""
        if self._thread is not None and self._thread.is_alive():
            return "running"
        if isinstance(self.error, StopRequested):
            return "stopped"
        return "failed" if self.error is not None else "finished"

    @property
    def progress(self) -> float:
        """The share of ``steps`` trained so far (from ``metrics.csv``), 0 to 1."""
        rows = _read_rows(self.out / "metrics.csv")
        done = int(float(rows[-1].get("env_steps") or 0)) if rows else 0
        return min(1.0, done / self.steps)

    @property
    def summary(self) -> dict[str, Any]:
        """What ``summary.json`` holds: steps, speed, final return, placement, evaluation.

        Raises ``RuntimeError`` while the run trains or when it did not finish.
        """
        if self._summary is None:
            raise RuntimeError(f"run {self.out} is {self.status}: it has no summary (call "
                               ".result() to wait for it)")
        return self._summary

    @property
    def metrics(self) -> Any:
        """``metrics.csv`` as a pandas ``DataFrame`` (one row per iteration), so far."""
        try:
            import pandas
        except ImportError:
            raise MissingExtra("Run.metrics", "notebook", "pandas",
                               f" (or read {self.out / 'metrics.csv'} with the csv module)"
                               ) from None
        return pandas.read_csv(self.out / "metrics.csv")

    @property
    def dashboard_link(self) -> str:
        """The Dask dashboard of the cluster the run trains on."""
        return self.client.dashboard_link

    def policy(self, deterministic: bool = True, best: bool = False) -> Any:
        """The trained policy, ``obs -> action`` (see :func:`daskrl.load_policy`)."""
        from daskrl.trained.load import load_policy

        return load_policy(self.out, deterministic=deterministic, best=best)

    def stop(self, timeout: float | None = None, wait: bool = True) -> Run:
        """End the run with a checkpoint of its last finished iteration; it can go on later
        with ``daskrl.train(..., out=run.out, resume=True)`` (or ``daskrl train ... --out
        OUT --resume``).

        The run notices the stop within a second wherever it waits: on an iteration, on the
        final evaluation, or before its first iteration. Raises ``TimeoutError`` when it
        still runs after ``timeout`` seconds (a task or checkpoint in progress); the stop
        stays asked for, so a later :meth:`result` returns once it ends. ``wait=False``
        asks and returns at once.
        """
        self._stop.set()
        if wait and self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                raise TimeoutError(f"run {self.out} was asked to stop but still runs after "
                                   f"{timeout} s; call result() to wait for its checkpoint")
        return self

    def result(self, timeout: float | None = None) -> Run:
        """Wait for the run to end (a ``TimeoutError`` after ``timeout`` seconds); raise its
        error if it failed; the run."""
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                raise TimeoutError(f"run {self.out} still trains after {timeout} s")
        if self.error is not None and not isinstance(self.error, StopRequested):
            raise self.error
        return self

    def __repr__(self) -> str:
        return f"Run({str(self.out)!r}, status={self.status!r}, progress={self.progress:.0%})"


def train(graph_or_algorithm: str | os.PathLike | types.ModuleType | Algorithm,
          client: Client | None = None, distribution: str | Distribution | None = None,
          steps: int = 500_000, out: str | os.PathLike | None = None, wait: bool = True,
          seed: int = 1, progress: bool = True, resume: bool = False,
          checkpoint_every: int = 10, eval_every: int = 0, evaluate: bool = True,
          deterministic: bool = False,
          resources: Mapping[str, Resources | str] | None = None,
          adapt: tuple[int, int] | None = None, pause_at: int | None = None,
          advice: bool = True, **config: Any) -> Run:
    """Train a graph script (its path or module) or an :class:`~daskrl.Algorithm`.

    Parameters
    ----------
    graph_or_algorithm : path, module or Algorithm
        A graph script such as ``"graphs/ppo.py"`` (or the module it loads as), built from
        its ``Config`` with ``config``; or an algorithm built already.
    client : distributed.Client, optional
        The cluster to train on: any Dask cluster (``LocalCluster``, ``SSHCluster``,
        dask-jobqueue, ``dask worker`` processes). None: an embedded local cluster with
        one worker process per replica (at most one per core), closed when the run ends.
    distribution : str or Distribution, optional
        How fragments are placed (``"actors-learner"``, ``"single"``...); None: the
        graph's own; ``"auto"``: the fastest of those the graph can use, probed on the
        cluster (:mod:`daskrl.runtime.auto`; ``summary["distribution_probe"]``), re-decided
        when workers join or leave or the rate drifts (:mod:`daskrl.runtime.redecide`;
        ``summary["distribution_redecided"]``); ``"auto:once"`` keeps the probe's choice.
    steps : int
        Env steps to train for.
    out : path, optional
        The run's folder (default ``runs/<name>-<time>``).
    wait : bool
        Return when the run ends (True) or at once, with the run training in a thread.
    seed : int
        The run's seed.
    progress : bool
        Show a progress bar (``tqdm.auto``: a widget in a notebook).
    resume : bool
        Continue the run in ``out`` from its latest checkpoint (one :meth:`Run.stop` wrote,
        say) up to ``steps``; without it an ``out`` holding checkpoints is refused.
    checkpoint_every : int
        Iterations between checkpoints (the last finished iteration is checkpointed at
        the end and on a stop too).
    eval_every : int
        Evaluate the policy every this many iterations (0: only at the end).
    evaluate : bool
        Run the final evaluation (``summary["eval_return_mean"]``).
    deterministic : bool
        Bit-identical weights for ``seed`` whatever the workers (see ``summary["determinism"]``).
    resources : mapping, optional
        Role -> resources replacing the graph's, as :class:`~daskrl.Resources` or the
        ``--resources`` spelling: ``{"learner": "GPU:1", "rollout": Resources(cpu=2)}``.
    adapt : (int, int), optional
        ``(MIN, MAX)`` workers of the embedded cluster, sized by the run through Dask's
        adaptive scaling (:mod:`daskrl.cluster.elastic`; ``summary["adapt"]``); not with
        ``client`` (call your cluster's own ``adapt``) nor ``deterministic``.
    pause_at : int, optional
        Pause after this iteration (counted from the run's start): the run ends with a
        checkpoint and its evaluation, its learning-rate schedule laid out for all
        ``steps``; ``resume=True`` with the same ``steps`` goes on from there (how
        population-based training trains its members in rounds).
    advice : bool
        Say once, mid-run, what to change when one part of the iteration dominates
        (:mod:`daskrl.observe.live_advice`); a sweep turns it off, since a trial's idle time
        is the other trials' work on the shared workers.
    **config
        The graph's ``Config`` fields, e.g. ``num_envs=8``.

    Returns
    -------
    Run
        Its ``summary``, ``metrics``, ``policy()``, ``dashboard_link``; with ``wait=False``
        also ``status``, ``progress``, ``stop()`` and ``result()``.

    Raises
    ------
    ValueError
        One line naming a bad setting, before anything trains.

    Notes
    -----
    A run of an algorithm (not a graph script) records its name, not a script, so
    :meth:`Run.policy` cannot rebuild it: train graph scripts to load their policies.

    Examples
    --------
    >>> run = train("graphs/ppo.py", steps=0)
    Traceback (most recent call last):
    ...
    ValueError: steps must be >= 1, got 0
    >>> from distributed import Client, LocalCluster  # doctest: +SKIP
    >>> client = Client(LocalCluster(n_workers=2, processes=False))  # doctest: +SKIP
    >>> run = train("graphs/ppo.py", client=client, steps=20_000, num_envs=4)  # doctest: +SKIP
    >>> run.summary["eval_return_mean"], run.metrics["episode_return_mean"].iloc[-1]
    ... # doctest: +SKIP
    """
    algo, graph, settings_meta = algorithm_of(graph_or_algorithm, config)
    if resources:
        algo = algo.with_resources(_role_resources(resources))
    auto = isinstance(distribution, str) and is_auto(distribution)
    redecide = auto and auto_redecides(str(distribution))
    if auto:  # probed on the cluster; the embedded one is sized for the largest candidate
        chosen = sizing(algo)
    else:
        chosen = get_distribution(distribution or algo.distribution) if not isinstance(
            distribution, Distribution) else distribution
    name = Path(graph).stem if graph else algo.name
    folder = Path(out) if out is not None else Path("runs") / (
        f"{name}-{time.strftime('%Y%m%d-%H%M%S')}")
    settings = RunSettings(out=folder, steps=steps, seed=seed, progress=progress,
                           resume=resume, checkpoint_every=checkpoint_every,
                           eval_every=eval_every, eval=evaluate, deterministic=deterministic,
                           pause_at=pause_at, advice=advice,
                           meta={"graph": graph or algo.name, "config": settings_meta})
    elastic = None
    try:
        check_settings(settings)
        if adapt is not None:
            elastic = _elastic(adapt, client, deterministic, chosen.workers_wanted(algo))
        if auto:
            refuse_deterministic(deterministic)
        else:
            check_distribution(chosen, algo, deterministic)
    except ValueError as exc:  # the checks name the command's flags: say the keywords
        raise ValueError(keyword_words(str(exc))) from None
    owned: tuple[Client, SpecCluster] | tuple[()] = ()
    if client is None:
        workers = max(1, min(os.cpu_count() or 1, chosen.workers_wanted(algo)))
        if elastic is not None:
            workers = elastic.minimum
        cluster = local_cluster(default_worker_resources(workers))
        client = Client(cluster)
        owned = (client, cluster)
        if elastic is not None:
            scale_like(cluster, default_worker_resources(1)[0])
            start_adapting(cluster, elastic)
            settings = dataclasses.replace(settings, observers=(elastic.observe,))
    run = Run(folder, steps, client, owned)

    def work(backend: Any) -> dict[str, Any]:
        picked, run_settings = (resolve(backend, algo, settings, redecide=redecide) if auto
                                else (chosen, settings))
        summary = train_run(backend, algo, picked, run_settings)
        if elastic is not None:
            summary["adapt"] = elastic.record()
            write_summary(folder / "summary.json", summary)
        return summary

    return run._start(work, wait)


def _elastic(adapt: tuple[int, int], client: Client | None, deterministic: bool,
             usable: int) -> Elastic:
    """``train(adapt=...)``'s policy, or a one-line refusal."""
    if client is not None:
        raise ValueError("adapt=(MIN, MAX) sizes the embedded cluster: with client=, call "
                         "your cluster's own adapt()")
    return plan(f"{adapt[0]}:{adapt[1]}", usable, deterministic)


def keyword_words(message: str) -> str:
    """A refusal written for the command line, in :func:`train`'s keywords.

    Examples
    --------
    >>> keyword_words("pass --resume to continue it, or choose another --out")
    'pass resume=True to continue it, or choose another out'
    >>> keyword_words("--checkpoint-every must be >= 1, got 0")
    'checkpoint_every must be >= 1, got 0'
    >>> keyword_words("with --deterministic name one (e.g. --distribution single)")
    'with deterministic=True name one (e.g. distribution="single")'
    """
    message = re.sub(r"--(resume|deterministic)\b", r"\1=True", message)
    message = re.sub(r"--distribution ([a-z][a-z-]*)\b", r'distribution="\1"', message)
    return re.sub(r"--([a-z][a-z-]*)", lambda m: m.group(1).replace("-", "_"), message)


def _role_resources(resources: Mapping[str, Resources | str]) -> dict[str, Resources]:
    """``train(resources=...)``: each role's :class:`Resources`, a string parsed as the
    ``--resources`` flag's ``KEY:N[,KEY:N]``."""
    out: dict[str, Resources] = {}
    for role, value in resources.items():
        if isinstance(value, Resources):
            out[role] = value
        elif isinstance(value, str):
            out.update(parse_role_resources([f"{role}={value}"]))
        else:
            raise TypeError(f"resources[{role!r}] must be a Resources or a string such as "
                            f"'GPU:1', got {type(value).__name__}")
    return out


def algorithm_of(what: Any, config: dict[str, Any]) -> tuple[Algorithm, str | None, dict]:
    """The algorithm to train, the graph script it came from, and its config as a dict."""
    if isinstance(what, Algorithm):
        if config:
            raise ValueError(f"settings {sorted(config)} apply to a graph script's Config; "
                             "an Algorithm is built already: pass the graph script instead")
        return what, None, {}
    if isinstance(what, (str, os.PathLike)):
        module, graph = load_graph(str(what)), str(Path(what).resolve())
    elif isinstance(what, types.ModuleType):
        module, graph = what, what.__dict__.get("__file__") or what.__name__
    else:
        raise TypeError(f"train() takes a graph script's path, its module or an Algorithm, "
                        f"got {type(what).__name__}")
    fields = {f.name for f in dataclasses.fields(module.Config) if f.init}
    unknown = sorted(set(config) - fields)
    if unknown:
        raise ValueError(f"{graph}: no setting(s) {unknown} in its Config; it has "
                         f"{sorted(fields)}")
    cfg = module.Config(**config)
    return module.build(cfg), graph, dataclasses.asdict(cfg)


def _read_rows(path: Path) -> list[dict[str, str]]:
    try:
        with path.open(newline="") as f:
            return list(csv.DictReader(f))
    except FileNotFoundError:
        return []
