"""DQN on CartPole-v1: daskrl's graphs/dqn.py against Stable-Baselines3's DQN, same settings.

Both use RL Zoo's tuned CartPole-v1 hyperparameters for SB3's DQN (lr 2.3e-3, batch 64,
buffer 100k, learning starts 1000, 128 gradient steps per 256 env steps, target fixed over
each burst, epsilon 1 -> 0.04 over 16 % of the run, two ReLU layers of 256); daskrl adds
double Q (SB3's DQN has none). Each run evaluates the greedy policy every ``--eval-every``
env steps (10 episodes); reported: env-steps/s over the run and the wall-clock seconds to
the first evaluation >= 475 (SB3's evaluation time is left out of its clock; daskrl's runs
in a task beside the training). Medians over seeds, all runs interleaved under the same load.

    python benchmarks/dqn_cartpole.py --seeds 3            # results/dqn_cartpole.json
    python benchmarks/dqn_cartpole.py --quick              # 5k steps, one seed
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import (
    ROOT,
    fmt,
    load_average,
    machine_info,
    markdown_table,
    median,
    ratio,
    write_json,
)

SOLVED = 475.0


def run_daskrl(steps: int, seed: int, eval_every: int) -> dict[str, Any]:
    """One ``daskrl train graphs/dqn.py`` run (single distribution, one worker)."""
    out = Path(tempfile.mkdtemp(prefix="dqn-bench-")) / "run"
    iters = max(1, eval_every // 256)
    cmd = [sys.executable, "-m", "daskrl", "train", str(ROOT / "graphs/dqn.py"),
           "--steps", str(steps), "--seed", str(seed), "--eval-every", str(iters),
           "--out", str(out), "--no-progress", "--workers", "2"]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    summary = json.loads((out / "summary.json").read_text())
    with (out / "metrics.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    wall = {int(r["iteration"]): float(r["wall_s"]) for r in rows if r.get("iteration")}
    evals = [(int(float(r["eval_iteration"])), float(r["eval_return_mean"])) for r in rows
             if r.get("eval_return_mean") and r.get("eval_iteration")]
    solved = next((wall.get(it) for it, ret in evals if ret >= SOLVED), None)
    return {"env_steps_per_s": summary["env_steps_per_s"], "wall_s": summary["wall_s"],
            "time_to_475_s": solved, "evals": evals,
            "final_eval": summary.get("eval_return_mean")}


def run_sb3(steps: int, seed: int, eval_every: int) -> dict[str, Any]:
    """One SB3 DQN run in this process (one torch thread, like a daskrl worker)."""
    import gymnasium as gym
    import torch
    from stable_baselines3 import DQN
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.evaluation import evaluate_policy

    torch.set_num_threads(1)

    class Evaluate(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.eval_s, self.evals, self.solved = 0.0, [], None
            self.t0 = time.perf_counter()
            self.env = gym.make("CartPole-v1")

        def _on_step(self) -> bool:
            if self.num_timesteps % eval_every == 0:
                t = time.perf_counter()
                ret, _ = evaluate_policy(self.model, self.env, 10, deterministic=True)
                self.eval_s += time.perf_counter() - t
                self.evals.append((self.num_timesteps, float(ret)))
                if ret >= SOLVED and self.solved is None:
                    self.solved = t - self.t0 - (self.eval_s - (time.perf_counter() - t))
            return True

    model = DQN("MlpPolicy", "CartPole-v1", learning_rate=2.3e-3, batch_size=64,
                buffer_size=100_000, learning_starts=1000, gamma=0.99, target_update_interval=10,
                train_freq=256, gradient_steps=128, exploration_fraction=0.16,
                exploration_final_eps=0.04, policy_kwargs={"net_arch": [256, 256]}, seed=seed,
                device="cpu")
    cb = Evaluate()
    t0 = time.perf_counter()
    model.learn(steps, callback=cb)
    wall = time.perf_counter() - t0 - cb.eval_s
    return {"env_steps_per_s": steps / wall, "wall_s": wall, "time_to_475_s": cb.solved,
            "evals": cb.evals, "final_eval": cb.evals[-1][1] if cb.evals else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50_000)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--eval-every", type=int, default=5120)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--child", choices=["sb3"], help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--json", type=Path, default=ROOT / "benchmarks/results/dqn_cartpole.json")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run_sb3(args.steps, args.seed, args.eval_every)))
        return
    if args.quick:
        args.steps, args.seeds, args.eval_every = 5120, 1, 2560
    load_before = load_average()
    runs: dict[str, list[dict[str, Any]]] = {"daskrl": [], "sb3": []}
    for seed in range(1, args.seeds + 1):
        runs["daskrl"].append(run_daskrl(args.steps, seed, args.eval_every))
        proc = subprocess.run([sys.executable, __file__, "--child", "sb3", "--seed", str(seed),
                               "--steps", str(args.steps), "--eval-every",
                               str(args.eval_every)], check=True, capture_output=True, text=True)
        runs["sb3"].append(json.loads(proc.stdout.strip().splitlines()[-1]))
        print(f"seed {seed}: daskrl {runs['daskrl'][-1]['env_steps_per_s']:.0f} steps/s, "
              f"sb3 {runs['sb3'][-1]['env_steps_per_s']:.0f} steps/s", flush=True)
    med = {name: {key: median([r[key] for r in rs]) for key in
                  ("env_steps_per_s", "time_to_475_s", "final_eval")}
           for name, rs in runs.items()}
    solved = {name: sum(r["time_to_475_s"] is not None for r in rs) for name, rs in runs.items()}
    rows = [[name, fmt(m["env_steps_per_s"]), fmt(m["time_to_475_s"]),
             f"{solved[name]}/{args.seeds}", fmt(m["final_eval"])] for name, m in med.items()]
    table = markdown_table(["system", "env-steps/s (median)", "s to eval 475 (median of "
                            "solved)", "seeds solved", "final eval (median)"], rows)
    speedup = ratio(med["daskrl"]["env_steps_per_s"], med["sb3"]["env_steps_per_s"])
    print(table)
    print(f"daskrl / SB3 env-steps/s: {fmt(speedup)}; load {load_before['load_1m']:.1f} -> "
          f"{load_average()['load_1m']:.1f} on {os.cpu_count()} CPUs")
    if not args.quick:
        write_json(args.json, {"runs": runs, "medians": med, "speedup": speedup,
                               "load": {"before": load_before, "after": load_average()},
                               "machine": machine_info(), "settings": vars(args) | {
                                   "json": str(args.json)}})


if __name__ == "__main__":
    main()
