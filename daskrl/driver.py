"""The training loop: submit iteration graphs ahead, record metrics, checkpoint, evaluate."""

from __future__ import annotations

import math
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from distributed import Client, Future

from . import roles
from .algorithm import Algorithm, LearnerOutput
from .checkpoint import load_latest, save_checkpoint
from .cluster import worker_resources
from .distributions import Distribution, IterationInputs
from .fragment import Fragment
from .graph import Placement, plan_placement, task
from .metrics import MetricsWriter, write_summary
from .state import drop_run


@dataclass
class RunSettings:
    """How long and where to train, and what to keep."""

    out: Path
    steps: int = 500_000
    seed: int = 1
    resume: bool = False
    checkpoint_every: int = 10
    keep_checkpoints: int = 3
    lookahead: int = 2
    eval: bool = True
    progress: bool = True
    meta: dict[str, Any] = field(default_factory=dict)


def place(client: Client, algo: Algorithm, distribution: Distribution) -> Placement:
    """Check every fragment's resources against the workers and pin replicas to names."""
    fragments = distribution.fragments(algo)
    if "evaluate" not in {f.role for f in fragments}:
        fragments.append(Fragment(roles.evaluate, "evaluate", algo.resources_for("evaluate")))
    return plan_placement(fragments, worker_resources(client))


def initial_output(algo: Algorithm, settings: RunSettings) -> tuple[LearnerOutput, int, dict]:
    """The first iteration's input: a fresh learner, or the latest checkpoint on resume."""
    ckpt = load_latest(settings.out / "checkpoints") if settings.resume else None
    if ckpt is not None:
        state = ckpt["learner"]
        out = LearnerOutput(ckpt["version"], state, state["model"], {})
        return out, ckpt["iteration"], ckpt["counters"]
    seed = roles.TaskContext("init", settings.seed, 0, 0, 1).replica_seed()
    learner = algo.make_learner(seed, "cpu")
    return LearnerOutput(0, learner.state_dict(), learner.weights(), {}), 0, {}


def train(
    client: Client, algo: Algorithm, distribution: Distribution, settings: RunSettings
) -> dict[str, Any]:
    """Train ``algo`` under ``distribution`` on ``client``'s cluster; return the summary.

    Writes ``metrics.csv``, ``summary.json`` and ``checkpoints/`` under ``settings.out``.
    Iteration ``k+1`` is submitted while ``k`` runs (``lookahead``), so the scheduler never
    waits for the driver; on Ctrl-C the last finished iteration is checkpointed.
    """
    out = settings.out
    out.mkdir(parents=True, exist_ok=True)
    placement = place(client, algo, distribution)
    learner_in, start_iter, counters = initial_output(algo, settings)
    num_iterations = max(1, math.ceil(settings.steps / algo.steps_per_iteration))
    run = uuid.uuid4().hex[:8]
    resume_after = start_iter if settings.resume else None
    writer = MetricsWriter(out / "metrics.csv", resume_after=resume_after)
    env_steps = int(counters.get("env_steps", 0))
    wall_before = float(counters.get("wall_s", 0.0))
    bar = _progress(settings.progress, num_iterations, start_iter)
    pending: deque[tuple[int, Future]] = deque()
    last_done: LearnerOutput = learner_in
    last_end: float | None = None
    overheads: list[float] = []
    t0 = time.perf_counter()
    k = start_iter
    try:
        while k < num_iterations or pending:
            while k < num_iterations and len(pending) < max(1, settings.lookahead):
                inputs = IterationInputs(algo, placement, run, settings.seed, k, num_iterations,
                                         learner_in)
                learner_in = client.compute(distribution.iteration(inputs))
                pending.append((k, learner_in))
                k += 1
            it, fut = pending.popleft()
            last_done = fut.result()
            m = dict(last_done.metrics)
            env_steps += m.get("env_steps", 0)
            wall = wall_before + time.perf_counter() - t0
            end = m.get("learn_t_end", 0.0)
            iter_s = end - (last_end if last_end is not None else m.get("rollout_t_start", end))
            inside = m.get("rollout_s", 0.0) + end - m.get("learn_t_start", end)
            last_end = end
            if it > start_iter:  # the first iteration also pays for worker start-up
                overheads.append(max(0.0, iter_s - inside) / iter_s if iter_s > 0 else 0.0)
            row = {"iteration": it + 1, "env_steps": env_steps, "wall_s": wall,
                   "env_steps_per_s": env_steps / wall if wall > 0 else 0.0,
                   "iteration_s": iter_s, "overhead_s": iter_s - inside,
                   **{k: v for k, v in m.items() if not k.endswith(("_t_start", "_t_end"))}}
            writer.write(row)
            if bar is not None:
                bar.update(1)
                bar.set_postfix(steps=env_steps, sps=f"{row['env_steps_per_s']:.0f}",
                                ret=f"{m.get('episode_return_mean', float('nan')):.1f}")
            counters = {"env_steps": env_steps, "wall_s": wall}
            if (it + 1) % settings.checkpoint_every == 0:
                _checkpoint(settings, last_done, counters)
    except KeyboardInterrupt:
        for _, fut in pending:
            fut.cancel()
        _checkpoint(settings, last_done, counters)
        raise
    finally:
        writer.close()
        if bar is not None:
            bar.close()
    wall = wall_before + time.perf_counter() - t0
    _checkpoint(settings, last_done, counters)
    summary: dict[str, Any] = {
        **settings.meta,
        "algorithm": algo.name,
        "distribution": distribution.name,
        "env_steps": env_steps,
        "iterations": num_iterations,
        "wall_s": wall,
        "env_steps_per_s": env_steps / wall if wall > 0 else 0.0,
        "dask_overhead_share": float(sorted(overheads)[len(overheads) // 2]) if overheads
        else float("nan"),
        "final_episode_return_mean": last_done.metrics.get("episode_return_mean", float("nan")),
        "placement": {role: list(names) for role, names in placement.workers.items()},
        "seed": settings.seed,
    }
    if settings.eval:
        inputs = IterationInputs(algo, placement, run, settings.seed, num_iterations,
                                 num_iterations, last_done)
        ev = task(roles.evaluate, inputs.context("evaluate", 0), algo, last_done, role="evaluate",
                  replica=0, iteration=num_iterations, run=run,
                  resources=placement.resources["evaluate"], worker=placement.worker("evaluate", 0))
        summary.update(client.compute(ev).result())
    client.run(drop_run, run)
    write_summary(out / "summary.json", summary)
    return summary


def _checkpoint(settings: RunSettings, output: LearnerOutput, counters: dict[str, float]) -> None:
    """Checkpoint a finished iteration (the learner's version counts iterations)."""
    if not output.metrics:
        return  # nothing trained since the start or the resume
    payload = {"version": output.version, "iteration": output.version, "learner": output.state,
               "counters": counters, "meta": settings.meta}
    save_checkpoint(settings.out / "checkpoints", output.version, payload,
                    keep=settings.keep_checkpoints)


def _progress(enabled: bool, total: int, initial: int) -> Any:
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, unit="it", desc="train", dynamic_ncols=True)
