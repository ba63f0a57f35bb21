"""TD3 learning: daskrl's graphs/td3.py beside Stable-Baselines3's TD3, same settings, per seed
at the same time (a load that changes by the minute is the same for both).

Both use RL Zoo's tuned settings for SB3's TD3 (learning rate 1e-3, batch 256, tau 0.005,
Gaussian action noise 0.1, target noise 0.2 clipped at 0.5, policy delay 2, 10k learning
starts, one gradient step per env step, ReLU layers of 400 and 300, one env); Pendulum-v1
with gamma 0.98 and a 200k buffer, the MuJoCo envs with gamma 0.99 and a 1M buffer. Reported
per env: env-steps/s over the run and the deterministic evaluation return (10 episodes) at
the end, medians over seeds, the load recorded per run; JSON under ``results/`` and a table
in ``td3.md`` (one marked section per env).

    python benchmarks/td3.py --env Pendulum-v1 --steps 20000 --seeds 3
    python benchmarks/td3.py --env Hopper-v5 --steps 50000 --seeds 2
    python benchmarks/td3.py --quick     # smoke: 1,500 steps, learning from 500; writes nothing
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
    update_section,
    write_json,
)

SYSTEMS = ("daskrl", "sb3")


def settings(env: str) -> dict[str, Any]:
    """RL Zoo's per-env settings for TD3 (the rest are shared)."""
    if env.startswith("Pendulum"):
        return {"gamma": 0.98, "buffer_size": 200_000}
    return {"gamma": 0.99, "buffer_size": 1_000_000}


def start(name: str, env: str, steps: int, seed: int, starts: int) -> tuple[subprocess.Popen, Path]:
    """Start one run (``daskrl train graphs/td3.py`` or the SB3 child); returns the process
    and the daskrl run's folder."""
    out = Path(tempfile.mkdtemp(prefix="td3-bench-")) / "run"
    if name == "sb3":
        cmd = [sys.executable, __file__, "--child", "--env", env, "--seed", str(seed),
               "--steps", str(steps), "--learning-starts", str(starts)]
    else:
        s = settings(env)
        cmd = [sys.executable, "-m", "daskrl", "train", str(ROOT / "graphs/td3.py"),
               "--env", env, "--gamma", str(s["gamma"]), "--buffer-size", str(s["buffer_size"]),
               "--learning-starts", str(starts), "--steps", str(steps), "--seed", str(seed),
               "--out", str(out), "--no-progress"]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=ROOT), out


def finish(name: str, proc: subprocess.Popen, out: Path) -> dict[str, Any]:
    """Wait for a run of :func:`start`; its speed, wall-clock and evaluation return."""
    stdout, stderr = proc.communicate()
    if proc.returncode:
        raise SystemExit(f"{' '.join(map(str, proc.args))} failed:\n{stderr[-3000:]}")
    if name == "sb3":
        return json.loads(stdout.strip().splitlines()[-1])
    summary = json.loads((out / "summary.json").read_text())
    return {"env_steps_per_s": summary["env_steps_per_s"], "wall_s": summary["wall_s"],
            "eval_return_mean": summary.get("eval_return_mean"),
            "recoveries": summary.get("recoveries", 0)}


def run_sb3(env: str, steps: int, seed: int, starts: int) -> dict[str, Any]:
    """One SB3 TD3 run in this process (one torch thread, like a daskrl worker)."""
    import gymnasium as gym
    import numpy as np
    import torch
    from stable_baselines3 import TD3
    from stable_baselines3.common.evaluation import evaluate_policy
    from stable_baselines3.common.noise import NormalActionNoise

    torch.set_num_threads(1)
    act_dim = gym.make(env).action_space.shape[0]
    noise = NormalActionNoise(np.zeros(act_dim), 0.1 * np.ones(act_dim))
    model = TD3("MlpPolicy", env, learning_rate=1e-3, learning_starts=starts,
                action_noise=noise, policy_kwargs={"net_arch": [400, 300]}, seed=seed,
                device="cpu", **settings(env))
    t0 = time.perf_counter()
    model.learn(steps)
    wall = time.perf_counter() - t0
    ret, _ = evaluate_policy(model, gym.make(env), 10, deterministic=True)
    return {"env_steps_per_s": steps / wall, "wall_s": wall, "eval_return_mean": float(ret)}


def report(args: argparse.Namespace, runs: dict[str, list[dict[str, Any]]]) -> None:
    """Print the table of the seeds run so far, write the JSON and ``td3.md``'s section of
    this env: after every seed, so a run cut short keeps what it measured."""
    med = {name: {key: median([r[key] for r in rs]) for key in
                  ("env_steps_per_s", "eval_return_mean")} for name, rs in runs.items()}
    loads = [r[k] for rs in runs.values() for r in rs for k in ("load_1m_before",
                                                                 "load_1m_after")]
    rows = [[name, fmt(m["env_steps_per_s"]),
             fmt(ratio(m["env_steps_per_s"], med["sb3"]["env_steps_per_s"])),
             fmt(m["eval_return_mean"]), ", ".join(f"{r['eval_return_mean']:.0f}" for r in rs)]
            for (name, m), rs in zip(med.items(), runs.values(), strict=True)]
    table = markdown_table(["system", "env-steps/s (median)", "x SB3",
                            f"eval return at {args.steps} steps (median)", "per seed"], rows)
    print(table)
    write_json(args.json, {"env": args.env, "runs": runs, "medians": med,
                           "speedup": ratio(med["daskrl"]["env_steps_per_s"],
                                            med["sb3"]["env_steps_per_s"]),
                           "load_1m_range": [min(loads), max(loads)],
                           "machine": machine_info(), "settings": vars(args) | {
                               "json": str(args.json)}})
    body = (f"`python benchmarks/td3.py --env {args.env} --steps {args.steps} --seeds "
            f"{len(runs['sb3'])}` (1-minute load {min(loads):.1f}-{max(loads):.1f} on "
            f"{os.cpu_count()} CPUs; per seed both runs at the same time; raw runs: "
            f"[`{args.json.relative_to(ROOT / 'benchmarks')}`]"
            f"({args.json.relative_to(ROOT / 'benchmarks')})).\n\n{table}\n")
    md = ROOT / "benchmarks" / "td3.md"
    if not md.exists():
        md.write_text("# TD3: daskrl vs Stable-Baselines3 TD3\n\n"
                      "Written by `benchmarks/td3.py`, one section per env.\n\n")
    update_section(md, args.env, body)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="Pendulum-v1")
    parser.add_argument("--steps", type=int, default=20_000)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--learning-starts", type=int, default=10_000)
    parser.add_argument("--quick", action="store_true",
                        help="smoke test: 1,500 steps learning from 500, one seed; writes nothing")
    parser.add_argument("--json", type=Path, help="default: results/td3_<env>.json")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run_sb3(args.env, args.steps, args.seed, args.learning_starts)))
        return
    if args.quick:
        args.steps, args.seeds, args.learning_starts = 1500, 1, 500
    args.json = (args.json or ROOT / "benchmarks" / "results" / f"td3_{args.env}.json").resolve()
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in SYSTEMS}
    for seed in range(1, args.seeds + 1):
        load = load_average()["load_1m"]
        started = {name: start(name, args.env, args.steps, seed, args.learning_starts)
                   for name in SYSTEMS}
        for name in SYSTEMS:
            run = finish(name, *started[name])
            run.update(seed=seed, load_1m_before=load, load_1m_after=load_average()["load_1m"])
            runs[name].append(run)
            print(f"{args.env} seed {seed}: {name} {run['env_steps_per_s']:.0f} steps/s, eval "
                  f"{run['eval_return_mean']:.0f}, load {load:.1f}", flush=True)
        if not args.quick:
            report(args, runs)


if __name__ == "__main__":
    main()
