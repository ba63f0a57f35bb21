"""How far PPO's frozen running statistics are from per-step ones, on a real training stream.

daskrl's actors normalise observations and scale rewards with the statistics that came with
their weights, frozen for the rollout; the learner merges the rollout's moments after its
update. Stable-Baselines3's ``VecNormalize`` folds every step into its statistics before it
normalises that step. At a rollout's boundaries both statistics are the moments of the same
data (up to gymnasium's prior count of 1e-4); inside a rollout they differ. This script
trains daskrl's PPO (``graphs/ppo.py``'s actor and learner in a plain loop, CleanRL's
settings, one env) and, for every rollout, replays its observations and discounted returns
through both rules:

- observations: ``|z_frozen - z_per_step|`` in units of the std, over steps and dimensions
  (median, 99th percentile), with ``z = clip((x - mean) / sqrt(var + 1e-8), -10, 10)``;
- rewards: ``|std_frozen / std_per_step - 1|`` of the return std that divides the rewards
  (median, max over the rollout's steps).

It measures the gap in the inputs the two rules produce, not its effect on learning (no A/B
of returns). Run: ``nice -n 10 python benchmarks/mujoco_ppo_norm.py`` (about a minute per
env on an idle core); writes ``results/mujoco_ppo_norm.json`` and a section of
``mujoco_ppo.md``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

from _common import update_section, write_json  # noqa: E402

from daskrl.algos.normalize import EPS, RunningMeanStd  # noqa: E402
from daskrl.core.script import load_graph  # noqa: E402

SETTINGS = {"num_envs": 1, "num_steps": 2048, "update_epochs": 10, "minibatch_size": 64,
            "learning_rate": 3e-4, "gamma": 0.99, "gae_lambda": 0.95, "clip_coef": 0.2,
            "clip_vloss": True, "ent_coef": 0.0, "vf_coef": 0.5, "max_grad_norm": 0.5,
            "hidden": 64}
"""CleanRL's ``ppo_continuous_action`` settings (as ``mujoco_ppo.py --set clip_vloss=true``)."""


def per_step(prior: RunningMeanStd, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean and variance after folding in each row of ``x`` in turn (row ``t`` included),
    starting from ``prior``: what ``VecNormalize`` normalises row ``t`` with.

    Examples
    --------
    >>> rms = RunningMeanStd((1,))
    >>> mean, var = per_step(rms, np.array([[1.0], [3.0]]))
    >>> [round(float(v), 3) for v in mean[:, 0]], round(float(var[1, 0]), 3)
    ([1.0, 2.0], 1.0)
    """
    c0 = float(prior.count)
    m0, v0 = prior.mean.numpy(), prior.var.numpy()
    x = x.reshape(len(x), -1).astype(np.float64)
    n = np.arange(1, len(x) + 1, dtype=np.float64)[:, None]
    mean_b = np.cumsum(x, 0) / n
    m2_b = np.maximum(np.cumsum(x * x, 0) - n * mean_b**2, 0.0)
    total = c0 + n
    delta = mean_b - m0
    mean = m0 + delta * n / total
    m2 = v0 * c0 + m2_b + delta**2 * c0 * n / total
    return mean.reshape(len(x), *prior.mean.shape), (m2 / total).reshape(len(x),
                                                                         *prior.mean.shape)


def gaps(prior_obs: RunningMeanStd, prior_ret: RunningMeanStd, obs: np.ndarray,
         seen: np.ndarray) -> dict[str, float]:
    """The rollout's observation and reward-scale gaps between the frozen and per-step rules."""
    clip = prior_obs.clip
    x = obs.astype(np.float64)
    frozen = np.clip((x - prior_obs.mean.numpy()) / np.sqrt(prior_obs.var.numpy() + EPS),
                     -clip, clip)
    mean, var = per_step(prior_obs, x)
    step = np.clip((x - mean) / np.sqrt(var + EPS), -clip, clip)
    d = np.abs(frozen - step)
    _, rvar = per_step(prior_ret, seen[:, None])
    ratio = np.abs(np.sqrt(prior_ret.var.item() + EPS) / np.sqrt(rvar + EPS) - 1)
    return {"obs_gap_median": float(np.median(d)), "obs_gap_p99": float(np.quantile(d, 0.99)),
            "reward_scale_gap_median": float(np.median(ratio)),
            "reward_scale_gap_max": float(ratio.max())}


def run(env_id: str, iterations: int, seed: int) -> list[dict[str, Any]]:
    """Train ``iterations`` updates of PPO on ``env_id``; the gaps of every rollout."""
    torch.set_num_threads(1)
    m = load_graph(str(ROOT / "graphs" / "ppo.py"))
    s = SETTINGS
    algo = m.build(m.Config(env=env_id, **{k: v for k, v in s.items()}))
    actor, learner = algo.make_actor(seed), algo.make_learner(seed, "cpu")
    out = []
    for k in range(iterations):
        actor.set_weights(learner.weights(), k)
        prior_obs = RunningMeanStd(learner.net.obs_rms.mean.shape)  # what the actor used
        prior_obs.load_state_dict(learner.net.obs_rms.state_dict())
        prior_ret = RunningMeanStd(())
        prior_ret.load_state_dict(learner.net.ret_rms.state_dict())
        batch = actor.rollout(s["num_steps"])
        rec = actor.inference_part()
        valid = rec.valid[: rec.t, 0]
        seen = rec.returns_seen[: rec.t, 0][valid]  # one env: time order
        learner.update([batch], k / iterations)
        out.append({"iteration": k, "env_steps_before": k * s["num_steps"],
                    **gaps(prior_obs, prior_ret, batch["obs"], seen),
                    "episode_return_mean": float(np.mean(batch["stats"]["episode_returns"]))
                    if batch["stats"]["episode_returns"] else None})
        print(env_id, out[-1], flush=True)
    return out


def report(record: dict[str, Any], path: Path) -> None:
    """The ``mujoco_ppo_norm`` section of ``benchmarks/mujoco_ppo.md``."""
    rows = []
    for env_id, its in record["runs"].items():
        for r in its:
            if r["iteration"] in (0, 1, 2, 4, 9, 19, 29, 49) or r is its[-1]:
                rows.append(f"| {env_id} | {r['iteration']} | {r['env_steps_before']:,} | "
                            f"{r['obs_gap_median']:.3g} | {r['obs_gap_p99']:.3g} | "
                            f"{r['reward_scale_gap_median']:.3g} | "
                            f"{r['reward_scale_gap_max']:.3g} |")
    load = record["load"]
    body = "\n".join([
        "## Frozen vs per-step normalisation statistics (measured gap in the inputs)",
        "",
        f"`python benchmarks/mujoco_ppo_norm.py` ({record['date']}, 1-minute load average "
        f"{min(load):.1f}-{max(load):.1f}): daskrl's PPO (CleanRL's settings, one env, seed "
        f"{record['seed']}) in a plain loop; each rollout's observations and discounted "
        "returns replayed through the frozen rule (daskrl: the statistics the actor got with "
        "its weights) and the per-step rule (SB3's `VecNormalize`). *obs gap*: "
        "`|z_frozen - z_per_step|` in stds over steps and dimensions; *reward-scale gap*: "
        "`|std_frozen / std_per_step - 1|` of the return std that divides the rewards. "
        "Iteration 0 is the first rollout, which daskrl does not normalise (prior mean 0, "
        "variance 1) while SB3 does from its first step.",
        "",
        "| env | iteration | env steps before | obs gap median | obs gap p99 | "
        "reward-scale gap median | reward-scale gap max |",
        "|:--|--:|--:|--:|--:|--:|--:|",
        *rows,
        "",
        f"Raw: [`results/{path.name}`](results/{path.name}).",
    ])
    update_section(ROOT / "benchmarks/mujoco_ppo.md", path.stem, body)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--envs", nargs="+", default=["Hopper-v5"])
    parser.add_argument("--iterations", type=int, default=30, help="rollouts of 2,048 steps")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path,
                        default=ROOT / "benchmarks/results/mujoco_ppo_norm.json")
    args = parser.parse_args()
    record: dict[str, Any] = {"settings": SETTINGS, "seed": args.seed, "runs": {}, "load": [],
                              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    for env_id in args.envs:
        record["load"].append(os.getloadavg()[0])
        record["runs"][env_id] = run(env_id, args.iterations, args.seed)
        record["load"].append(os.getloadavg()[0])
    write_json(args.json, record)
    report(record, args.json)


if __name__ == "__main__":
    main()
