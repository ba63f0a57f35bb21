"""SAC on Pendulum-v1: daskrl's graphs/sac.py against Stable-Baselines3's SAC, same settings.

Both use RL Zoo's tuned Pendulum-v1 settings for SB3's SAC (learning rate 1e-3, batch 256,
buffer 1M, learning starts 100, tau 0.005, one gradient step per env step, automatic
entropy, two ReLU layers of 256, one env). Reported: env-steps/s over the run and the
deterministic evaluation return (10 episodes) after ``--steps`` (20k), medians over seeds,
the systems interleaved under the same load.

    python benchmarks/sac_pendulum.py --seeds 3        # results/sac_pendulum.json
    python benchmarks/sac_pendulum.py --quick          # 2k steps, one seed
"""

from __future__ import annotations

import argparse
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


def run_daskrl(steps: int, seed: int) -> dict[str, Any]:
    """One ``daskrl train graphs/sac.py`` run (single distribution)."""
    out = Path(tempfile.mkdtemp(prefix="sac-bench-")) / "run"
    cmd = [sys.executable, "-m", "daskrl", "train", str(ROOT / "graphs/sac.py"),
           "--steps", str(steps), "--seed", str(seed), "--out", str(out), "--no-progress"]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    summary = json.loads((out / "summary.json").read_text())
    return {"env_steps_per_s": summary["env_steps_per_s"], "wall_s": summary["wall_s"],
            "eval_return_mean": summary.get("eval_return_mean")}


def run_sb3(steps: int, seed: int) -> dict[str, Any]:
    """One SB3 SAC run in this process (one torch thread, like a daskrl worker)."""
    import gymnasium as gym
    import torch
    from stable_baselines3 import SAC
    from stable_baselines3.common.evaluation import evaluate_policy

    torch.set_num_threads(1)
    model = SAC("MlpPolicy", "Pendulum-v1", learning_rate=1e-3, seed=seed, device="cpu")
    t0 = time.perf_counter()
    model.learn(steps)
    wall = time.perf_counter() - t0
    ret, _ = evaluate_policy(model, gym.make("Pendulum-v1"), 10, deterministic=True)
    return {"env_steps_per_s": steps / wall, "wall_s": wall, "eval_return_mean": float(ret)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20_000)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--child", choices=["sb3"], help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--json", type=Path, default=ROOT / "benchmarks/results/sac_pendulum.json")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run_sb3(args.steps, args.seed)))
        return
    if args.quick:
        args.steps, args.seeds = 2000, 1
    load_before = load_average()
    runs: dict[str, list[dict[str, Any]]] = {"daskrl": [], "sb3": []}
    for seed in range(1, args.seeds + 1):
        runs["daskrl"].append(run_daskrl(args.steps, seed))
        proc = subprocess.run([sys.executable, __file__, "--child", "sb3", "--seed", str(seed),
                               "--steps", str(args.steps)], check=True, capture_output=True,
                              text=True)
        runs["sb3"].append(json.loads(proc.stdout.strip().splitlines()[-1]))
        print(f"seed {seed}: " + ", ".join(
            f"{name} {rs[-1]['env_steps_per_s']:.0f} steps/s, eval {rs[-1]['eval_return_mean']:.0f}"
            for name, rs in runs.items()), flush=True)
    med = {name: {key: median([r[key] for r in rs]) for key in
                  ("env_steps_per_s", "eval_return_mean")} for name, rs in runs.items()}
    rows = [[name, fmt(m["env_steps_per_s"]), fmt(m["eval_return_mean"])]
            for name, m in med.items()]
    table = markdown_table(["system", "env-steps/s (median)",
                            f"eval return at {args.steps} steps (median)"], rows)
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
