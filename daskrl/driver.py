"""The training loop: submit iteration graphs ahead, record metrics, checkpoint, evaluate."""

from __future__ import annotations

import math
import sys
import time
import uuid
from collections import deque
from concurrent.futures import CancelledError
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from distributed import Client
from distributed.client import FutureCancelledError
from distributed.scheduler import KilledWorker, NoValidWorkerError, NoWorkerError

from . import roles
from .algorithm import Algorithm, LearnerOutput
from .backend import Backend, DaskBackend, Handle
from .checkpoint import list_checkpoints, load_latest, save_checkpoint, weights_sha256
from .distributions import Distribution, IterationInputs
from .distributions.base import iterations_per_task
from .failures import FragmentError, PeerLost, failure, save_failure
from .fragment import Fragment
from .graph import Placement, plan_placement, task
from .memory import check_memory
from .metrics import write_summary
from .profile import Timeline
from .recorder import Recorder
from .state import drop_run

_LOST = (FutureCancelledError, KilledWorker, NoValidWorkerError, NoWorkerError, PeerLost)


@dataclass
class RunSettings:
    """How long and where to train, and what to keep."""

    out: Path
    steps: int = 500_000
    seed: int = 1
    resume: bool = False
    checkpoint_every: int = 10
    keep_checkpoints: int = 3
    lookahead: int = 4
    chain: int = 64
    """Tasks chained on futures before the chain restarts from the driver's copy of the
    last result (bounds the lineage Dask keeps; each restart drains the pipeline)."""
    task_s: float = 0.5
    """Seconds of work per task the driver aims for when the distribution can run several
    iterations in one task (``iterations_per_task``): short iterations are grouped so that
    Dask's per-task cost is paid once per group. 0 keeps one iteration per task."""
    max_recoveries: int = 3
    replan_timeout: float = 30.0
    tensorboard: bool = True
    eval: bool = True
    deterministic: bool = False
    env_retries: int = 2
    progress: bool = True
    meta: dict[str, Any] = field(default_factory=dict)


def check_settings(settings: RunSettings) -> None:
    """Refuse settings that would fail later or lose an earlier run's checkpoints."""
    if settings.checkpoint_every < 1:
        raise ValueError(f"--checkpoint-every must be >= 1, got {settings.checkpoint_every}")
    if settings.steps < 1:
        raise ValueError(f"--steps must be >= 1, got {settings.steps}")
    if settings.env_retries < 0:
        raise ValueError(f"--env-retries must be >= 0, got {settings.env_retries}")
    has_ckpt = bool(list_checkpoints(settings.out / "checkpoints"))
    if settings.resume and not has_ckpt:
        raise ValueError(f"--resume: no checkpoints under {settings.out}; pass the --out of an "
                         "earlier run")
    if not settings.resume and has_ckpt:
        raise ValueError(f"{settings.out} already holds checkpoints of an earlier run: pass "
                         "--resume to continue it, or choose another --out")


def place(backend: Backend, algo: Algorithm, distribution: Distribution) -> Placement:
    """Check every fragment's resources against the workers and pin replicas to names."""
    fragments = distribution.fragments(algo)
    if "evaluate" not in {f.role for f in fragments}:
        fragments.append(Fragment(roles.evaluate, "evaluate", algo.resources_for("evaluate")))
    placement = plan_placement(fragments, backend.workers(fragments))
    check = getattr(distribution, "check_placement", None)
    if callable(check):  # a distribution's own conditions (raises ValueError)
        check(placement, algo)
    return placement


def initial_output(algo: Algorithm, settings: RunSettings) -> tuple[LearnerOutput, int, dict]:
    """The first iteration's input: a fresh learner, or the latest checkpoint on resume."""
    ckpt = load_latest(settings.out / "checkpoints") if settings.resume else None
    if ckpt is not None:
        state = ckpt["learner"]
        out = LearnerOutput(ckpt["version"], state, state["model"], {}, ckpt.get("actors", {}))
        return out, ckpt["iteration"], ckpt["counters"]
    seed = roles.TaskContext("init", settings.seed, 0, 0, 1).replica_seed()
    learner = algo.make_learner(seed, "cpu")
    return LearnerOutput(0, learner.state_dict(), learner.weights(), {}), 0, {}


def train(
    client: Client | Backend, algo: Algorithm, distribution: Distribution, settings: RunSettings
) -> dict[str, Any]:
    """Train ``algo`` under ``distribution`` on a cluster (or in-process); return the summary.

    ``client`` is a ``distributed.Client`` or a :class:`~daskrl.backend.Backend`
    (``SyncBackend()`` runs everything in this process).

    Writes ``metrics.csv``, ``summary.json`` and ``checkpoints/`` under ``settings.out``.
    Up to ``lookahead`` iterations are in flight, each taking the previous one's learner
    output as a future, so the scheduler never waits for the driver. Every ``chain``
    iterations the chain restarts from data the driver holds, which bounds the lineage Dask
    keeps (and would recompute after a worker loss). If an iteration is lost with a worker,
    the driver resubmits it from the last finished one; on Ctrl-C that one is checkpointed.
    """
    backend = DaskBackend(client) if isinstance(client, Client) else client
    out = settings.out
    check_settings(settings)
    out.mkdir(parents=True, exist_ok=True)
    placement = place(backend, algo, distribution)
    check_memory(backend, algo, distribution, placement)  # refuse what would not fit
    pins = _pins(backend, placement)
    last_done, start_iter, counters = initial_output(algo, settings)
    num_iterations = max(1, math.ceil(settings.steps / algo.steps_per_iteration))
    run = uuid.uuid4().hex[:8]
    runs: list[str] = []  # ids of attempts lost with a worker; their state is dropped at the end
    depth = max(1, settings.lookahead)
    recorder = Recorder(settings, num_iterations, start_iter, counters, Timeline(backend, run))
    pending: deque[tuple[int, int, Handle]] = deque()  # (first iteration, count, handle)
    learner_in: Any = None
    k = base = start_iter
    linked = 0  # tasks submitted since the chain last restarted
    recoveries = 0
    cap = _task_cap(distribution, algo, placement, settings)
    count = 1  # iterations per task: grows to about settings.task_s of work once timed
    timed = cap <= 1  # until then one task in flight: the next ones are sized from it
    unchecked: Any = None  # the first graph, whose annotations the scheduler must keep
    try:
        while k < num_iterations or pending:
            while k < num_iterations and len(pending) < (depth if timed else 1) and (
                    linked < max(depth, settings.chain) or k == base):
                if k == base:  # restart the chain from data: no lineage behind it
                    learner_in = backend.scatter(last_done, placement.worker("learner", 0))
                    linked = 0
                linked += 1
                n = min(count, num_iterations - k)
                inputs = IterationInputs(algo, placement, run, settings.seed, k, num_iterations,
                                         learner_in, settings.deterministic, settings.env_retries,
                                         n)
                graph = distribution.iteration(inputs)
                handle = backend.submit(graph)
                if k == start_iter:
                    unchecked = graph
                learner_in = backend.as_input(handle)
                pending.append((k, n, handle))
                k += n
            if unchecked is not None:  # after the first window is queued: the workers go on
                backend.check_annotations(unchecked)
                unchecked = None
            it, n, fut = pending.popleft()
            try:
                output = _result(backend, fut, pins)
            except (CancelledError, WorkersLost, *_LOST) as exc:
                recoveries += 1
                if recoveries > settings.max_recoveries:
                    raise RuntimeError(
                        f"iteration {it + 1} was lost {recoveries} times ({exc}); giving up "
                        "- check the workers' logs") from exc
                print(f"daskrl: iteration {it + 1} lost ({exc}); placing the fragments again "
                      "and resubmitting from the last finished iteration", file=sys.stderr)
                # Release, not cancel: the scheduler's cancel walks into the next iteration's
                # tasks, which no client holds, fails an assertion and drops this client.
                for *_, other in [(it, n, fut), *pending]:
                    other.release()
                pending.clear()
                learner_in = graph = None
                placement = _replace(backend, algo, distribution, settings.replan_timeout)
                pins = _pins(backend, placement)
                cap = _task_cap(distribution, algo, placement, settings)
                count, timed = 1, cap <= 1
                k = base = it
                # New task keys and fresh worker state for the retry: a key reused right
                # after its cancellation can be cancelled by the scheduler's late notice, and
                # state the lost attempt left half-way through an iteration must not be used.
                runs.append(run)
                run = uuid.uuid4().hex[:8]
                if recorder.timeline is not None:
                    recorder.timeline.run = run
                continue
            _check_finite(it, output, settings.out)
            last_done = output
            per_iteration = recorder.record(it, last_done)
            if cap > 1 and per_iteration > 0:
                count = max(1, min(cap, int(settings.task_s / per_iteration)))
                timed = True
            if not pending:
                base = k  # the chain is drained: restart it from the driver's copy
            if (it + n) // settings.checkpoint_every > it // settings.checkpoint_every:
                _checkpoint(settings, last_done, recorder.counters)
    except BaseException as exc:  # Ctrl-C, SIGTERM or an error: keep the last good iteration
        for *_, fut in pending:
            fut.release()
        _checkpoint(settings, last_done, recorder.counters)
        if isinstance(exc, Exception):
            _raise_saved(exc, out)
        raise
    finally:
        recorder.close()
    env_steps, counters = recorder.env_steps, recorder.counters
    wall = counters["wall_s"]
    _checkpoint(settings, last_done, counters)
    summary: dict[str, Any] = {
        **settings.meta,
        "algorithm": algo.name,
        "distribution": distribution.name,
        "env_steps": env_steps,
        "iterations": num_iterations,
        "wall_s": wall,
        "env_steps_per_s": env_steps / wall if wall > 0 else 0.0,
        "dask_overhead_share": recorder.overhead_share(),
        "final_episode_return_mean": last_done.metrics.get("episode_return_mean", float("nan")),
        "placement": {role: list(names) for role, names in placement.workers.items()},
        "seed": settings.seed,
        "deterministic": settings.deterministic,
        "weights_sha256": weights_sha256(last_done.weights),
    }
    if settings.eval:
        inputs = IterationInputs(algo, placement, run, settings.seed, num_iterations,
                                 num_iterations, last_done, settings.deterministic)
        ev = task(roles.evaluate, inputs.context("evaluate", 0), algo, last_done, role="evaluate",
                  replica=0, iteration=num_iterations, run=run,
                  resources=placement.resources["evaluate"], worker=placement.worker("evaluate", 0))
        try:
            summary.update(backend.submit(ev).result())
        except Exception as exc:
            _raise_saved(exc, out)
            raise
    for attempt in [*runs, run]:
        backend.run_everywhere(drop_run, attempt)
    write_summary(out / "summary.json", summary)
    return summary


class WorkersLost(RuntimeError):
    """A worker that replicas are pinned to has left the cluster."""


def _result(backend: Backend, handle: Handle, pinned: dict[str, str]) -> LearnerOutput:
    """Wait for an iteration; raise :class:`WorkersLost` if a pinned worker leaves meanwhile.

    ``pinned`` maps the names replicas are pinned to onto their addresses at placement: the
    scheduler resolves a name pin to an address, so a worker restarted under the same name
    is lost to the tasks pinned before. Fetching the result is bounded too: when the worker
    holding it dies, Dask waits for a recomputation that a task pinned there never gets.
    """
    fetch = 2.0
    while True:
        while not backend.done(handle, timeout=1.0):
            _check_pins(backend, pinned)
        try:
            return handle.result(timeout=fetch)
        except TimeoutError:
            if getattr(handle, "status", None) == "error":
                raise  # the task's own TimeoutError
            _check_pins(backend, pinned)
            fetch = min(2 * fetch, 60.0)  # large data on a slow link: wait longer each time


def _check_pins(backend: Backend, pinned: dict[str, str]) -> None:
    now = backend.identities()
    gone = sorted(name for name, addr in pinned.items() if now.get(name) != addr)
    if gone:
        raise WorkersLost(f"worker(s) {', '.join(gone)} left the cluster")


def _pins(backend: Backend, placement: Placement) -> dict[str, str]:
    names = {name for names in placement.workers.values() for name in names}
    now = backend.identities()
    return {name: now.get(name, "") for name in names}


def _replace(backend: Backend, algo: Algorithm, distribution: Distribution,
             timeout: float) -> Placement:
    """Plan placement on the workers there are now, waiting a while for replacements."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return place(backend, algo, distribution)
        except ValueError as exc:
            if time.monotonic() > deadline:
                raise ValueError(f"the cluster lost the workers this run needs: {exc}") from None
            time.sleep(1.0)


def _raise_saved(exc: Exception, out: Path) -> None:
    """When ``exc`` came from a fragment, save its call and raise :class:`FragmentError`."""
    path = save_failure(exc, out / "failures")
    if path is None:
        return
    record = failure(exc) or {}
    raise FragmentError(
        f"task {record.get('key')} failed on worker {record.get('worker')!r}: "
        f"{record.get('error')}\n{record.get('traceback', '').rstrip()}\n"
        f"its inputs are saved in {path}; run it again in this process with "
        f"`daskrl replay {path}` (add --pdb to debug)") from exc


def _task_cap(distribution: Distribution, algo: Algorithm, placement: Placement,
              settings: RunSettings) -> int:
    """The most iterations per task for this placement (1 when ``task_s`` is 0)."""
    if settings.task_s <= 0:
        return 1
    probe = IterationInputs(algo, placement, "", settings.seed, 0, 1, None,
                            settings.deterministic, settings.env_retries)
    return iterations_per_task(distribution, probe)


def _check_finite(it: int, output: LearnerOutput, out: Path) -> None:
    """Stop on a NaN/inf loss before it reaches a checkpoint."""
    for j, metrics in enumerate([*output.history, output.metrics]):
        bad = {k: v for k, v in metrics.items()
               if k.startswith("losses/") and isinstance(v, float) and not math.isfinite(v)
               and k != "losses/explained_variance"}
        if bad:
            raise FloatingPointError(
                f"iteration {it + j + 1}: non-finite loss {bad}; training stopped and the last "
                f"good checkpoint is kept in {out / 'checkpoints'} - lower --learning-rate or "
                "--max-grad-norm, or check the env's rewards for NaN/inf")


def _checkpoint(settings: RunSettings, output: LearnerOutput, counters: dict[str, float]) -> None:
    """Checkpoint a finished iteration (the learner's version counts iterations)."""
    if not output.metrics:
        return  # nothing trained since the start or the resume
    payload = {"version": output.version, "iteration": output.version, "learner": output.state,
               "actors": output.actors, "counters": counters, "meta": settings.meta}
    save_checkpoint(settings.out / "checkpoints", output.version, payload,
                    keep=settings.keep_checkpoints)
