"""PPO CartPole benchmark: the shared settings, what a run reports, and the solved rule."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from _common import (
    ROOT,
)

ENV_ID = "CartPole-v1"
GRAPH = Path("graphs") / "ppo.py"
"""The daskrl graph script, relative to the source tree the runs import daskrl from."""
DEFAULT_JSON = ROOT / "benchmarks" / "results" / "ppo_cartpole.json"
DEFAULT_README = ROOT / "benchmarks" / "README.md"
SYSTEMS = ("daskrl", "sb3", "lean", "hand", "daskrl-stale", "daskrl-compile",
           "daskrl-stale-compile")
LABELS = {"daskrl": "daskrl", "sb3": "SB3", "lean": "lean loop", "hand": "hand kernel",
          "daskrl-stale": "daskrl stale=1", "daskrl-compile": "daskrl --compile",
          "daskrl-stale-compile": "daskrl stale=1 --compile"}
"""``hand``: ``hand_kernel.py``'s numpy PPO in the lean loop, the reference limit."""
DISTRIBUTIONS = {"daskrl": "actors-learner", "daskrl-stale": "actors-learner:stale=1",
                 "daskrl-compile": "actors-learner",
                 "daskrl-stale-compile": "actors-learner:stale=1"}
"""The daskrl systems: the default (on-policy), the opt-in one-step-stale mode, and each
with its whole gradient step compiled (inductor's cache warm after the first run)."""
FLAGS = {"daskrl-compile": ("--compile",), "daskrl-stale-compile": ("--compile",)}
"""Extra ``daskrl train`` flags of a daskrl system."""
POLL_S = 0.05


@dataclass(frozen=True)
class Hyper:
    """PPO settings shared by every system (CleanRL names)."""

    num_envs: int = 8
    num_steps: int = 128
    update_epochs: int = 4
    minibatch_size: int = 256
    learning_rate: float = 2.5e-4
    anneal_lr: bool = True
    gamma: float = 0.99
    gae_lambda: float = 0.95
    clip_coef: float = 0.2
    clip_vloss: bool = False
    """SB3 does not clip the value loss; daskrl (like CleanRL) does unless told not to."""
    ent_coef: float = 0.01
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    hidden: int = 64
    eval_episodes: int = 10

    def daskrl_flags(self) -> list[str]:
        """The same settings as ``daskrl train graphs/ppo.py`` flags."""
        flags: list[str] = []
        for name, value in asdict(self).items():
            flag = "--" + name.replace("_", "-")
            if isinstance(value, bool):
                flags.append(flag if value else "--no-" + flag[2:])
            else:
                flags += [flag, str(value)]
        return flags


@dataclass
class Iteration:
    """One finished training iteration, as every system reports it."""

    t_end: float
    """Epoch seconds at which the iteration (rollout and update) finished."""
    env_steps: int
    """Env steps so far, counted by the system itself."""
    episodes: int
    """Training episodes that ended in this iteration's rollout."""
    return_mean: float | None
    """Mean return of those episodes (``None`` when none ended)."""


@dataclass
class Trace:
    """What a run reports: its iterations, timings and (optionally) a final evaluation."""

    t_launch: float
    t_train_start: float
    iterations: list[Iteration]
    eval_return_mean: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)


# ----------------------------------------------------------------------------------------
# the rule, and the numbers derived from a trace


def first_solved(iterations: list[Iteration], threshold: float, window: int) -> int | None:
    """Index of the first iteration whose recent training episodes average ``threshold``.

    The rule: walk back from iteration ``k`` over whole iterations until at least ``window``
    episodes are covered; ``k`` counts as solved when the mean return of those episodes
    (every episode weighted equally) is at least ``threshold``. Whole iterations keep the
    rule computable from per-iteration means, so it reads the same for every system; the
    window may hold a few more than ``window`` episodes.

    Examples
    --------
    >>> its = [Iteration(0, 1, 20, 20.0), Iteration(1, 2, 4, 480.0), Iteration(2, 3, 8, 490.0)]
    >>> first_solved(its, 475, 10), first_solved(its, 475, 12), first_solved(its, 495, 10)
    (2, 2, None)
    """
    for k in range(len(iterations)):
        count, total, j = 0, 0.0, k
        while j >= 0 and count < window:
            it = iterations[j]
            if it.episodes and it.return_mean is not None:
                count += it.episodes
                total += it.episodes * it.return_mean
            j -= 1
        if count >= window and total / count >= threshold:
            return k
    return None


def throughput_numbers(trace: Trace) -> dict[str, Any]:
    """End-to-end and steady-state env-steps/s, start-up and total time of a run."""
    its = trace.iterations
    if not its:
        return {"error": "no iteration finished"}
    steps = its[-1].env_steps
    e2e = its[-1].t_end - trace.t_launch
    out: dict[str, Any] = {
        "env_steps": steps,
        "iterations": len(its),
        "e2e_s": e2e,
        "startup_s": trace.t_train_start - trace.t_launch,
        "first_iteration_s": its[0].t_end - trace.t_train_start,
        "env_steps_per_s": steps / e2e if e2e > 0 else None,
        "steady_env_steps_per_s": None,
    }
    if len(its) > 1 and its[-1].t_end > its[0].t_end:
        out["steady_env_steps_per_s"] = (
            (its[-1].env_steps - its[0].env_steps) / (its[-1].t_end - its[0].t_end)
        )
    cpu = trace.extra.get("cpu_s")
    out["env_steps_per_cpu_s"] = steps / cpu if cpu else None
    return {**out, **trace.extra}


def solve_numbers(trace: Trace, threshold: float, window: int) -> dict[str, Any]:
    """Time and env steps to the threshold, and the final greedy evaluation, of a run."""
    its = trace.iterations
    k = first_solved(its, threshold, window)
    return {
        "env_steps": its[-1].env_steps if its else 0,
        "iterations": len(its),
        "reached": k is not None,
        "time_to_threshold_s": its[k].t_end - trace.t_launch if k is not None else None,
        "train_time_to_threshold_s": (
            its[k].t_end - trace.t_train_start if k is not None else None),
        "env_steps_to_threshold": its[k].env_steps if k is not None else None,
        "iteration_to_threshold": k + 1 if k is not None else None,
        "eval_return_mean": trace.eval_return_mean,
        "eval_solved": (trace.eval_return_mean is not None
                        and trace.eval_return_mean >= threshold),
        "final_train_return_mean": next(
            (it.return_mean for it in reversed(its) if it.return_mean is not None), None),
    }
