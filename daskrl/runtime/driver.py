"""Training: set a run up, run its iterations, write the summary and evaluate.

:func:`train` checks the settings, places the fragments, refuses what would not fit in
memory, starts from a fresh learner or the latest checkpoint, and hands the iterations to
a :class:`~daskrl.runtime.run_loop.RunLoop` (submit ahead, record, recover, checkpoint).
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from pathlib import Path
from typing import Any

from distributed import Client

from daskrl.core import roles
from daskrl.core.algorithm import Algorithm, LearnerOutput
from daskrl.core.failures import (
    FragmentError,
    FragmentTypeError,
    RunStopped,
    StopAsked,
    failure,
    save_failure,
)
from daskrl.core.placement import Placement, task
from daskrl.core.weights import weights_sha256
from daskrl.core.worker_state import drop_run
from daskrl.distributions import Distribution, IterationInputs
from daskrl.observe.board_feed import RunFeed
from daskrl.observe.live_advice import RunAdvisor
from daskrl.observe.metrics import write_summary
from daskrl.observe.plot import read_metrics
from daskrl.observe.profile import kept_threads
from daskrl.observe.timeline import Timeline
from daskrl.runtime.checkpoint import load_for_resume, load_latest
from daskrl.runtime.dask_backend import DaskBackend
from daskrl.runtime.determinism import NUMERICS, determinism_record, warn_unpinned_numerics
from daskrl.runtime.engine import Backend
from daskrl.runtime.memory import check_memory
from daskrl.runtime.occupancy import release
from daskrl.runtime.recorder import Recorder
from daskrl.runtime.replan import since_last_switch
from daskrl.runtime.run_loop import Attempt, RunLoop, place
from daskrl.runtime.settings import RunSettings, check_settings

__all__ = ["RunSettings", "check_settings", "finished_iterations", "initial_output", "place",
           "train"]


def check_distribution(distribution: Distribution, algo: Algorithm, deterministic: bool = False
                       ) -> None:
    """Refuse, in one line, an algorithm or a mode the distribution cannot serve.

    Examples
    --------
    >>> from daskrl.distributions import get_distribution
    >>> algo = Algorithm("a", print, print, print, num_steps=8, capabilities={"gradient-actor"},
    ...                  num_actors=2)
    >>> check_distribution(get_distribution("async"), algo)  # it serves A3C's actors
    >>> check_distribution(get_distribution("async"), algo, deterministic=True)
    ... # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: --deterministic: the 'async' distribution's results depend on the order ...
    """
    distribution.check(algo)
    if deterministic and not distribution.deterministic:
        raise ValueError(f"--deterministic: the {distribution.name!r} distribution's results "
                         "depend on the order its tasks finish; choose a synchronous distribution")


def write_config(out: Path, meta: dict[str, Any]) -> Path | None:
    """Write the graph's config (``meta["config"]``) to ``out/config.yaml``, which
    ``daskrl train GRAPH --config`` reads back; None when ``meta`` has no config.

    Examples
    --------
    >>> import tempfile
    >>> path = write_config(Path(tempfile.mkdtemp()), {"graph": "g.py",
    ...                     "config": {"hidden": (64, 64), "env": "CartPole-v1"}})
    >>> print(path.read_text().splitlines()[-4:])
    ['env: CartPole-v1', 'hidden:', '- 64', '- 64']
    """
    if not meta.get("config"):
        return None
    import yaml

    config = json.loads(json.dumps(meta["config"], default=str))  # tuples as lists
    graph = meta.get("graph", "GRAPH")
    path = out / "config.yaml"
    path.write_text(f"# the graph settings of this run: `daskrl train {graph} --config "
                    f"{path}` repeats them (flags override)\n"
                    + yaml.safe_dump(config, sort_keys=True))
    return path


def finished_iterations(out: Path) -> int:
    """Iterations done by the run in ``out``: its newest checkpoint's (0 without one).

    Examples
    --------
    >>> import tempfile
    >>> finished_iterations(Path(tempfile.mkdtemp()))
    0
    """
    ckpt = load_latest(out / "checkpoints")
    return 0 if ckpt is None else int(ckpt["iteration"])


def schedule_start(previous: dict[str, Any] | None, first: int, total: int
                   ) -> dict[str, Any]:
    """The learning-rate schedule of a run that starts at iteration ``first`` of ``total``:
    ``{"start", "at", "iterations"}`` (see ``TaskContext.schedule``), kept in the summary and
    the checkpoints' meta as ``"schedule"``.

    A resume of the same length keeps the schedule it had (``previous``, from the
    checkpoint); one with another length goes on from the progress the old schedule had
    reached at ``first``, linearly to 1 at the new ``total``.

    Examples
    --------
    >>> schedule_start(None, 0, 100)
    {'start': 0, 'at': 0.0, 'iterations': 100}
    >>> schedule_start({'start': 0, 'at': 0.0, 'iterations': 100}, 50, 200)
    {'start': 50, 'at': 0.5, 'iterations': 200}
    """
    if previous is None or first == 0:
        return {"start": 0, "at": 0.0, "iterations": total}
    if int(previous["iterations"]) == total:
        return dict(previous)
    start, at, old = int(previous["start"]), float(previous["at"]), int(previous["iterations"])
    reached = (first / old if start == 0 and at == 0.0
               else at + (1.0 - at) * (first - start) / max(1, old - start))
    return {"start": first, "at": min(1.0, reached), "iterations": total}


def initial_output(algo: Algorithm, settings: RunSettings) -> tuple[LearnerOutput, int, dict]:
    """The first iteration's input: a fresh learner, or the latest checkpoint on resume.

    Returns the input, the iteration it precedes and the counters to continue from.
    """
    ckpt = None
    if settings.resume:  # damaged files only: refuse, and change nothing (see load_for_resume)
        loaded = load_for_resume(settings.out / "checkpoints")
        if (warning := loaded.warning()) is not None:
            print(warning, file=sys.stderr)
        ckpt = loaded.payload
    if ckpt is not None:
        state = ckpt["learner"]
        out = LearnerOutput(ckpt["version"], state, state["model"], {}, ckpt.get("actors", {}),
                            coordinator=ckpt.get("coordinator", {}))
        return coordinated_start(algo, out), ckpt["iteration"], ckpt["counters"]
    seed = roles.TaskContext("init", settings.seed, 0, 0, 1).replica_seed()
    learner = algo.make_learner(seed, "cpu")
    out = LearnerOutput(0, learner.state_dict(), learner.weights(), {})
    return coordinated_start(algo, out), 0, {}


def coordinated_start(algo: Algorithm, output: LearnerOutput) -> LearnerOutput:
    """The first iteration's input with the coordinator's (if any) picks: they are not
    checkpointed, only its state, so it decides them again here."""
    if algo.make_coordinator is None:
        return output
    return roles.checked_coordination(algo.make_coordinator().start(output), output,
                                      "the coordinator's start(output)")


def train(
    client: Client | Backend, algo: Algorithm, distribution: Distribution, settings: RunSettings
) -> dict[str, Any]:
    """Train ``algo`` under ``distribution`` on a cluster (or in-process); return the summary.

    ``client`` is a ``distributed.Client`` or a :class:`~daskrl.runtime.engine.Backend`
    (``SyncBackend()`` runs everything in this process).

    Writes ``metrics.csv``, ``summary.json`` and ``checkpoints/`` under ``settings.out``.
    Up to ``lookahead`` iterations are in flight, each taking the previous one's learner
    output as a future, so the scheduler never waits for the driver. Every ``chain``
    iterations the chain restarts from data the driver holds, which bounds the lineage Dask
    keeps (and would recompute after a worker loss). If an iteration is lost with a worker,
    the driver resubmits it from the last finished one; on Ctrl-C that one is checkpointed.
    See :class:`RunLoop`.

    Examples
    --------
    >>> import tempfile
    >>> from daskrl.runtime.sync_backend import SyncBackend
    >>> from daskrl.distributions import get_distribution
    >>> train(SyncBackend(), None, get_distribution("single"),
    ...       RunSettings(Path(tempfile.mkdtemp()), steps=-1))
    Traceback (most recent call last):
    ...
    ValueError: --steps must be >= 1, got -1
    """
    backend = DaskBackend(client) if isinstance(client, Client) else client
    out = settings.out
    check_settings(settings)
    check_distribution(distribution, algo, settings.deterministic)  # before any task
    start, first, counters = initial_output(algo, settings)  # before anything is written
    out.mkdir(parents=True, exist_ok=True)
    write_config(out, settings.meta)
    token = str(out.resolve())  # this run's claim on workers, until it ends (occupancy)
    try:
        return _train_placed(backend, algo, distribution, settings,
                             place(backend, algo, distribution, token), start, first, counters)
    finally:
        release(token)


def _train_placed(backend: Backend, algo: Algorithm, distribution: Distribution,
                  settings: RunSettings, placement: Placement, start: LearnerOutput,
                  first: int, counters: dict) -> dict[str, Any]:
    """:func:`train` once the fragments are placed."""
    out = settings.out
    check_memory(backend, algo, distribution, placement)  # refuse what would not fit
    if settings.deterministic:
        warn_unpinned_numerics(backend.worker_environ(NUMERICS))
    total = max(1, math.ceil(settings.steps / algo.steps_per_iteration))
    previous = None
    if settings.resume and first > 0:
        ckpt = load_latest(out / "checkpoints") or {}
        meta = ckpt.get("meta") or {}
        # a run from before schedules were recorded: its length is unknown, keep the new one
        previous = meta.get("schedule") or {"start": 0, "at": 0.0, "iterations": total}
    schedule = schedule_start(previous, first, total)
    settings = dataclasses.replace(settings, schedule=(schedule["start"], schedule["at"]),
                                   meta={**settings.meta, "schedule": schedule})
    advisor = RunAdvisor(settings.meta.get("config")) if settings.advice else None
    if advisor is not None:
        settings = dataclasses.replace(settings, observers=(*settings.observers,
                                                            advisor.observe))
    attempt = Attempt.begin(backend, algo, distribution, placement, settings)
    feed = RunFeed(backend.publish, attempt.run, board_meta(settings, algo, distribution, total))
    try:
        recorder = Recorder(out, total, first, counters, resume=settings.resume,
                            tensorboard=settings.tensorboard, progress=settings.progress,
                            timeline=Timeline(backend, attempt.run), feed=feed)
        loop = RunLoop(backend, algo, distribution, settings, attempt, recorder, start, first,
                       total)
        summary = _run(backend, algo, distribution, settings, loop, total, advisor)
    except BaseException as exc:
        # Ctrl-C, SIGTERM and Run.stop end a run as stopped; anything else, as failed
        feed.end("stopped" if isinstance(exc, StopAsked) or not isinstance(exc, Exception)
                 else "failed")
        raise
    feed.end("finished")
    return summary


def board_meta(settings: RunSettings, algo: Algorithm, distribution: Distribution,
               total: int) -> dict[str, Any]:
    """What the dashboard's daskrl page says of a run besides its figures.

    Examples
    --------
    >>> algo = Algorithm("ppo", print, print, print, num_steps=8)
    >>> from daskrl.distributions import get_distribution
    >>> board_meta(RunSettings(Path("runs/ppo-1"), meta={"graph": "graphs/ppo.py"}), algo,
    ...            get_distribution("single"), 10)["graph"]
    'ppo'
    """
    graph = settings.meta.get("graph")
    return {"name": settings.out.name, "out": str(settings.out.resolve()),
            "graph": Path(graph).stem if isinstance(graph, str) else algo.name,
            "algorithm": algo.name, "distribution": distribution.name, "iterations": total,
            "seed": settings.seed}


def _run(backend: Backend, algo: Algorithm, distribution: Distribution, settings: RunSettings,
         loop: RunLoop, total: int, advisor: RunAdvisor | None = None) -> dict[str, Any]:
    """Run the iterations, checkpoint, evaluate and write the summary."""
    out, recorder = settings.out, loop.recorder
    try:
        loop.run()
    except BaseException as exc:  # Ctrl-C, SIGTERM or an error: keep the last good iteration
        loop.release()
        try:
            loop.checkpoint()
        except RunStopped as failed:  # a full disk: the error that stopped the run stands
            if not isinstance(exc, RunStopped):
                print(f"daskrl: {failed}", file=sys.stderr)
        if isinstance(exc, Exception):
            _raise_saved(exc, out)
        raise
    finally:
        recorder.close()
    loop.checkpoint()
    summary = _summary(loop.settings, algo, loop.distribution, loop)
    summary["advice"] = advisor.given if advisor is not None else []
    summary["determinism"] = determinism_record(settings.deterministic, loop.distribution,
                                                backend.worker_environ(NUMERICS))
    if loop.total > 0:  # the distribution's own figures, from the metrics just written
        columns = read_metrics(out)
        summary.update(loop.distribution.headline_figures(
            since_last_switch(columns, loop.replans.records)))
        # --compile: what the learner's process spent compiling (the last row's)
        compile_s = (columns.get("compile_s") or [math.nan])[-1]
        if not math.isnan(compile_s):
            summary["compile_s"] = compile_s
        # the threads its update kept (daskrl.core.learner_threads)
        threads = kept_threads(columns.get("learner_threads") or [])
        if threads is not None:
            summary["learner_threads"] = threads
    if settings.eval:
        summary.update(_evaluate(backend, algo, settings, loop, total))
        summary.update(loop.evals.forgetting(summary.get("eval_return_mean", math.nan)))
        if "eval_return_mean" in summary and recorder.feed is not None:
            # the final evaluation (in the summary, not in metrics.csv), on the page too
            recorder.feed.row({"env_steps": recorder.env_steps, "eval_iteration": total,
                               "eval_return_mean": summary["eval_return_mean"]})
    for run in loop.attempts():
        backend.run_everywhere(drop_run, run)
    write_summary(out / "summary.json", summary)
    return summary


def _summary(settings: RunSettings, algo: Algorithm, distribution: Distribution,
             loop: RunLoop) -> dict[str, Any]:
    recorder, last_done = loop.recorder, loop.last_done
    wall = recorder.counters["wall_s"]
    return {
        **settings.meta,
        "algorithm": algo.name,
        "distribution": distribution.name,
        "env_steps": recorder.env_steps,
        "iterations": loop.total,
        "wall_s": wall,
        "env_steps_per_s": recorder.env_steps / wall if wall > 0 else 0.0,
        "dask_overhead_share": recorder.overhead_share(),
        "task_compute_s": recorder.compute_s(),
        "final_episode_return_mean": last_done.metrics.get("episode_return_mean", float("nan")),
        "placement": {role: list(names)
                      for role, names in loop.attempt.placement.workers.items()},
        "seed": settings.seed,
        "deterministic": settings.deterministic,
        "weights_sha256": weights_sha256(last_done.weights),
        "replans": loop.replans.records,
        **({"distribution_redecided": loop.replans.redecider.record()}
           if loop.replans.redecider else {}),
    }


def _evaluate(backend: Backend, algo: Algorithm, settings: RunSettings, loop: RunLoop,
              total: int) -> dict[str, Any]:
    """The final evaluation's metrics, on the evaluate fragment's worker."""
    placement, run, last_done = loop.attempt.placement, loop.attempt.run, loop.last_done
    inputs = IterationInputs(algo, placement, run, settings.seed, total, total, last_done,
                             settings.deterministic)
    ev = task(roles.evaluate, inputs.context("evaluate", 0), algo, last_done, role="evaluate",
              replica=0, iteration=total, run=run, resources=placement.resources["evaluate"],
              worker=placement.worker("evaluate", 0))
    try:
        handle = backend.submit(ev)
        while not backend.done(handle, 1.0):  # a stop asked meanwhile is seen here
            pass
        return handle.result()
    except Exception as exc:
        _raise_saved(exc, settings.out)
        raise


def _raise_saved(exc: Exception, out: Path) -> None:
    """When ``exc`` came from a fragment, save its call and raise :class:`FragmentError`."""
    path = save_failure(exc, out / "failures")
    if path is None:
        return
    record = failure(exc) or {}
    if isinstance(exc, FragmentTypeError):  # a broken contract: the line says it all
        raise FragmentError(f"{exc} (task {record.get('key')}; its inputs are saved in "
                            f"{path} for `daskrl replay`)") from exc
    raise FragmentError(
        f"task {record.get('key')} failed on worker {record.get('worker')!r}: "
        f"{record.get('error')}\n{record.get('traceback', '').rstrip()}\n"
        f"its inputs are saved in {path}; run it again in this process with "
        f"`daskrl replay {path}` (add --pdb to debug)") from exc
