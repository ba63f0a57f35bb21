"""What to change in a run: the advice for its bottleneck, and for a learner on its own
clock that waits for batches, how many actors to add."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from typing import Any


def advice(kind: str, config: Mapping[str, Any] | None = None) -> str:
    """What to change for a ``kind``-bound run, naming the values to set from the run's
    graph ``config`` (``summary.json``'s) when it has the setting.

    Examples
    --------
    >>> advice("learn", {"num_minibatches": 8, "num_envs": 8, "num_steps": 128})[:80]
    'learner-bound: fewer, larger minibatches (--num-minibatches 4: half as many grad'
    >>> advice("learn", {"train_frequency": 1, "batch_size": 256})[:76]
    'learner-bound: fewer gradient steps per env step (--train-frequency 2: one g'
    >>> advice("overhead", {})[:72]
    'overhead-bound: put more work in each task (e.g. double --num-steps and '
    """
    cfg = dict(config or {})

    def doubled(name: str) -> str:
        flag = "--" + name.replace("_", "-")
        value = cfg.get(name)
        return f"{flag} {value * 2}" if isinstance(value, int) and value > 0 else (
            f"double {flag}")

    if kind == "env":
        return (f"env-bound: add rollout replicas ({doubled('num_actors')}) or envs per "
                f"replica ({doubled('num_envs')}), with a worker per replica (--workers)")
    if kind == "inference":
        return (f"inference-bound: batch more envs per forward pass ({doubled('num_envs')}), "
                "or serve the policy from a GPU (--distribution central-inference "
                "--resources learner=GPU:1)")
    if kind == "learn" and "train_frequency" in cfg and "num_minibatches" not in cfg:
        # a replay learner (DQN, SAC, TD3): its gradient steps follow the env steps
        compile = "" if cfg.get("compile") else "compile the gradient step (--compile), "
        return (f"learner-bound: fewer gradient steps per env step "
                f"({doubled('train_frequency')}: one gradient step per twice the env steps), "
                f"{compile}or give the learner a GPU (--resources learner=GPU:1)")
    if kind == "learn":
        mb = cfg.get("num_minibatches")
        fewer = (f"--num-minibatches {max(1, mb // 2)}" if isinstance(mb, int) and mb > 1
                 else "halve --num-minibatches")
        return (f"learner-bound: fewer, larger minibatches ({fewer}: half as many gradient "
                "steps, each on twice the data), give the learner a GPU (--resources "
                "learner=GPU:1), or the data-parallel distribution")
    if kind == "transfer":
        return ("transfer-bound: move less between workers per iteration: fewer, larger "
                "workers (--workers 1), or everything on one worker (--distribution single)")
    steps = doubled("num_steps")
    steps = f"e.g. {steps}" if steps.startswith("double") else steps
    return (f"overhead-bound: put more work in each task ({steps} and "
            f"{doubled('num_envs')}) so Dask's per-task cost is amortised")


def bottleneck(parts: Mapping[str, float], config: Mapping[str, Any] | None = None) -> str:
    """The :func:`advice` for the largest part (rollout bookkeeping counts with the envs:
    more replicas share it too).

    Examples
    --------
    >>> bottleneck({"env stepping": 0.5, "learning": 0.2, "scheduler and idle": 0.1},
    ...            {"num_actors": 1, "num_envs": 8})[:72]
    'env-bound: add rollout replicas (--num-actors 2) or envs per replica (--'
    """
    return advice(bound(parts)[0], config)


def bound(parts: Mapping[str, float]) -> tuple[str, float]:
    """The kind of the largest part (:func:`advice`'s ``kind``) and its seconds.

    Examples
    --------
    >>> bound({"env stepping": 0.5, "learning": 0.2, "rollout, other (buffers, GAE)": 0.1})
    ('env', 0.6)
    """
    get = parts.get
    scores = {
        "env": get("env stepping", 0.0) + get("rollout, other (buffers, GAE)", 0.0)
        + (0.0 if "env stepping" in parts else get("rollout (env + inference)", 0.0)),
        "inference": get("inference", 0.0),
        "learn": get("learning", 0.0),
        "transfer": get("data transfer", 0.0),
        "overhead": get("scheduler and idle", get("scheduler, transfer and idle", 0.0)),
    }
    kind = max(scores, key=lambda k: scores[k])
    return kind, scores[kind]


BUSY_TARGET = 0.95
"""The learner busy share below which a learner on its own clock counts as actor-bound."""


def learner_waits(rows: list[dict[str, float]], config: Mapping[str, Any] | None = None
                  ) -> str | None:
    """For a learner on its own clock (``impala``: rows with ``learner_busy``), its busy
    share and, when it waited for batches, how many actors to add (from the rows'
    ``actors_for_busy``: actors whose batches would land one per update). None for other
    runs.

    Examples
    --------
    >>> rows = [{"learner_busy": 0.6, "actors_for_busy": 4.0}] * 3
    >>> learner_waits(rows, {"num_actors": 2})[:68]
    'learner busy: 60.0% of wall time (waiting for batches 40.0%); actor-'
    >>> learner_waits(rows, {"num_actors": 2}).split("; ")[1][:44]
    'actor-bound: add 2 actors (--num-actors 4), '
    >>> learner_waits([{"learner_busy": 0.99}]) is None or "actor-bound" not in learner_waits(
    ...     [{"learner_busy": 0.99}])
    True
    """
    busy = [r["learner_busy"] for r in rows if not math.isnan(r.get("learner_busy", math.nan))]
    if not busy:
        return None
    share = statistics.fmean(busy)
    line = f"learner busy: {share:.1%} of wall time (waiting for batches {1 - share:.1%})"
    if share >= BUSY_TARGET:
        return line
    want = [r["actors_for_busy"] for r in rows
            if not math.isnan(r.get("actors_for_busy", math.nan))]
    have = int((config or {}).get("num_actors") or 0)
    add = max(1, math.ceil(statistics.median(want)) - have) if want and have else 1
    flag = f" (--num-actors {have + add})" if have else ""
    return (f"{line}; actor-bound: add {add} actor{'s' if add > 1 else ''}{flag}, each with a "
            "core of its own (--workers), so that a batch is there when an update ends")
