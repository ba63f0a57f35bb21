"""SAC on Pendulum-v1: daskrl's graphs/sac.py against Stable-Baselines3's SAC, same settings.

Both use RL Zoo's tuned Pendulum-v1 settings for SB3's SAC (learning rate 1e-3, batch 256,
buffer 1M, learning starts 100, tau 0.005, one gradient step per env step, automatic
entropy, two ReLU layers of 256, one env). Reported: env-steps/s over the run and the
deterministic evaluation return (10 episodes) after ``--steps`` (20k), medians over seeds;
per seed the two runs follow each other (``--concurrent``: run at the same time, so a load
that changes by the minute is the same for both), the load recorded per run.

    python benchmarks/sac_pendulum.py --seeds 3        # results/sac_pendulum.json, sac_pendulum.md
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
    update_section,
    write_json,
)
from dqn_cartpole import profile_section


def start(name: str, steps: int, seed: int) -> tuple[subprocess.Popen, Path]:
    """Start one run: ``daskrl train graphs/sac.py`` (single distribution) or the SB3 child;
    returns the process and the daskrl run's folder."""
    out = Path(tempfile.mkdtemp(prefix="sac-bench-")) / "run"
    if name == "sb3":
        cmd = [sys.executable, __file__, "--child", "sb3", "--seed", str(seed), "--steps",
               str(steps)]
    else:
        cmd = [sys.executable, "-m", "daskrl", "train", str(ROOT / "graphs/sac.py"),
               "--steps", str(steps), "--seed", str(seed), "--out", str(out), "--no-progress"]
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


def report(args: argparse.Namespace, runs: dict[str, list[dict[str, Any]]],
           load_before: dict[str, Any]) -> None:
    """Print the table of the seeds run so far and (unless ``--quick``) write the JSON and
    ``sac_pendulum.md``: after every seed, so a run cut short keeps what it measured."""
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
    speedup = ratio(med["daskrl"]["env_steps_per_s"], med["sb3"]["env_steps_per_s"])
    print(table)
    print(f"daskrl / SB3 env-steps/s: {fmt(speedup)}; load {min(loads):.1f}-{max(loads):.1f} "
          f"on {os.cpu_count()} CPUs")
    if not args.quick:
        write_json(args.json, {"runs": runs, "medians": med, "speedup": speedup,
                               "load": {"before": load_before, "after": load_average(),
                                        "range_1m": [min(loads), max(loads)]},
                               "machine": machine_info(), "settings": vars(args) | {
                                   "json": str(args.json)}})
        md = args.json.parent.parent / "sac_pendulum.md"
        run = (f"`python benchmarks/sac_pendulum.py --seeds {len(runs['sb3'])} --steps "
               f"{args.steps}{' --concurrent' if args.concurrent else ''}"
               f"{f' --json {args.json.resolve().relative_to(ROOT)}' if args.section else ''}"
               f"{f' --section {args.section}' if args.section else ''}` (1-minute load "
               f"{min(loads):.1f}-{max(loads):.1f} on {os.cpu_count()} CPUs; per seed the runs "
               f"{'run at the same time' if args.concurrent else 'follow each other'}).\n\n"
               f"{table}\n")
        if args.section:  # one marked section of the page; the rest stays as it is
            update_section(md, args.section, run)
        else:
            md.write_text("# SAC on Pendulum-v1: daskrl vs Stable-Baselines3 SAC\n\n" + run
                          + profile_section(args.json.parent / "sac_profile.json"))

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20_000)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--concurrent", action="store_true",
                        help="run daskrl and SB3 of a seed at the same time (a machine whose "
                             "load changes by the minute gives both the same)")
    parser.add_argument("--section", help="write the table into this marked section of "
                        "sac_pendulum.md instead of rewriting the page (a speed-only run)")
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
        load = load_average()["load_1m"]
        if args.concurrent:  # both at once: each sees the other and the same outside load
            started = {name: start(name, args.steps, seed) for name in runs}
            done = {name: finish(name, *started[name]) for name in runs}
        else:
            done = {}
            for name in runs:
                load_each = load_average()["load_1m"]
                done[name] = finish(name, *start(name, args.steps, seed))
                done[name]["load_1m_before"] = load_each
                done[name]["load_1m_after"] = load_average()["load_1m"]
        for name, run in done.items():
            run.setdefault("load_1m_before", load)
            run.setdefault("load_1m_after", load_average()["load_1m"])
            run["seed"] = seed
            runs[name].append(run)
            print(f"seed {seed}: {name} {run['env_steps_per_s']:.0f} steps/s, eval "
                  f"{run['eval_return_mean']:.0f}, load {run['load_1m_before']:.1f}",
                  flush=True)
        report(args, runs, load_before)


if __name__ == "__main__":
    main()
