"""DQN on CartPole-v1: daskrl's graphs/dqn.py against Stable-Baselines3's DQN, same settings.

Both use RL Zoo's tuned CartPole-v1 hyperparameters for SB3's DQN (lr 2.3e-3 annealed
linearly to 0 over the run, as daskrl's default and SB3's schedule form; batch 64,
buffer 100k, learning starts 1000, 128 gradient steps per 256 env steps, target fixed over
each burst, epsilon 1 -> 0.04 over 16 % of the run, two ReLU layers of 256) on 4 envs (SB3:
a DummyVecEnv of 4, train_freq 64 vector steps). The row "daskrl" has SB3's settings exactly
(``--no-double-q``: SB3's DQN has no double Q); "daskrl, double Q" is daskrl's default, a
separate row. Each run evaluates the greedy policy every ``--eval-every`` env steps (10
episodes); reported: env-steps/s over the run and the wall-clock seconds to the first
evaluation >= 475 (SB3's evaluation time is left out of its clock; daskrl's runs in a task
beside the training). Medians over seeds; per seed the three runs follow each other, so all
see the same load (recorded per run).

    python benchmarks/dqn_cartpole.py --seeds 3 --compile-row   # results/dqn_cartpole.json
    python benchmarks/dqn_cartpole.py --seeds 3 --steps 300000 --no-double-q-row
                                                           # results/dqn_cartpole_300k.json
    python benchmarks/dqn_cartpole.py --quick              # 5k steps, one seed

A budget other than 50k steps is saved apart and shown in a section of its own. A call keeps
the seeds its JSON holds with the same settings and runs the others (``--seeds 3`` after a
one-seed call runs seeds 2-3; each run records its commit); ``--fresh`` runs every seed again.
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
DEFAULT_STEPS = 50_000
RESULTS = ROOT / "benchmarks" / "results"
MAIN = RESULTS / "dqn_cartpole.json"


def run_daskrl(steps: int, seed: int, eval_every: int, double_q: bool,
               compile: bool = False) -> dict[str, Any]:
    """One ``daskrl train graphs/dqn.py`` run (single distribution; evaluation on a second
    worker), its gradient steps compiled with ``compile``."""
    out = Path(tempfile.mkdtemp(prefix="dqn-bench-")) / "run"
    iters = max(1, eval_every // 256)
    cmd = [sys.executable, "-m", "daskrl", "train", str(ROOT / "graphs/dqn.py"),
           "--steps", str(steps), "--seed", str(seed), "--eval-every", str(iters),
           "--out", str(out), "--no-progress", "--workers", "2",
           "--double-q" if double_q else "--no-double-q", *(["--compile"] if compile else [])]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    summary = json.loads((out / "summary.json").read_text())
    with (out / "metrics.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    wall = {int(r["iteration"]): float(r["wall_s"]) for r in rows if r.get("iteration")}
    evals = [(int(float(r["eval_iteration"])), float(r["eval_return_mean"])) for r in rows
             if r.get("eval_return_mean") and r.get("eval_iteration")]
    solved = next((wall.get(it) for it, ret in evals if ret >= SOLVED), None)
    compile_s = [float(r["compile_s"]) for r in rows if r.get("compile_s")]
    return {"env_steps_per_s": summary["env_steps_per_s"], "wall_s": summary["wall_s"],
            "time_to_475_s": solved, "evals": evals,
            "compile_s": compile_s[-1] if compile_s else None,
            "final_eval": summary.get("eval_return_mean")}


def run_sb3(steps: int, seed: int, eval_every: int) -> dict[str, Any]:
    """One SB3 DQN run in this process (one torch thread, like a daskrl worker)."""
    import gymnasium as gym
    import torch
    from stable_baselines3 import DQN
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
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

    # 4 envs as daskrl's: train_freq counts vector steps (64 x 4 = 256 env steps); the
    # target update interval (10 env steps, 2 vector steps) keeps the target fixed over
    # each burst of gradient steps, as with one env
    env = make_vec_env("CartPole-v1", n_envs=4, seed=seed)
    # daskrl's graph anneals the learning rate linearly to 0 over the run; SB3 calls a
    # schedule with the share of the run remaining (1 -> 0): the same line
    model = DQN("MlpPolicy", env, learning_rate=lambda remaining: 2.3e-3 * remaining,
                batch_size=64,
                buffer_size=100_000, learning_starts=1000, gamma=0.99, target_update_interval=10,
                train_freq=64, gradient_steps=128, exploration_fraction=0.16,
                exploration_final_eps=0.04, policy_kwargs={"net_arch": [256, 256]}, seed=seed,
                device="cpu")
    cb = Evaluate()
    t0 = time.perf_counter()
    model.learn(steps, callback=cb)
    wall = time.perf_counter() - t0 - cb.eval_s
    return {"env_steps_per_s": steps / wall, "wall_s": wall, "time_to_475_s": cb.solved,
            "evals": cb.evals, "final_eval": cb.evals[-1][1] if cb.evals else None}


def _code(data: dict[str, Any]) -> str:
    """Which code a result measured: the commit, and whether the tree had changes."""
    machine = data.get("machine", {})
    dirty = " with uncommitted changes" if machine.get("git_dirty") else ""
    note = f" ({data['note']})" if data.get("note") else ""
    codes: dict[str, set[int]] = {}  # commit -> seeds: a resumed call keeps earlier runs
    for run in (r for rs in data.get("runs", {}).values() for r in rs):
        codes.setdefault(run.get("code", machine.get("git_commit", "?")), set()).add(run["seed"])
    if len(codes) == 1:
        dirty = dirty if next(iter(codes)) == machine.get("git_commit") else ""
        return f"code at {next(iter(codes))}{dirty}{note}"
    if len(codes) > 1:
        return "code at " + ", ".join(
            f"{code} (seed{'s' if len(seeds) > 1 else ''} "
            f"{', '.join(map(str, sorted(seeds)))})" for code, seeds in codes.items()) + (
            f"{dirty}{note}")
    return f"code at {machine.get('git_commit', '?')}{dirty}{note}"


def profile_section(path: Path) -> str:
    """The per-step table of ``benchmarks/offpolicy_profile.py`` (its JSON), if it ran."""
    if not path.exists():
        return ""
    data = json.loads(path.read_text())
    load = data["load"]
    return (f"\n## Per gradient step and per env step\n\n`{data['command']}` (1-minute load "
            f"{load['before']['load_1m']:.1f} -> {load['after']['load_1m']:.1f}; "
            f"{_code(data)})\n\n"
            f"{data['table']}\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--eval-every", type=int, default=5120)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--report", action="store_true",
                        help="rewrite dqn_cartpole.md from the saved JSON, running nothing")
    parser.add_argument("--no-double-q-row", action="store_true",
                        help="leave out the row of daskrl's default (double Q)")
    parser.add_argument("--compile-row", action="store_true",
                        help="add a row of the first with --compile (whole gradient steps "
                             "compiled)")
    parser.add_argument("--fresh", action="store_true",
                        help="run every seed again, replacing the runs --json holds (by "
                             "default a call keeps the seeds it holds with the same settings)")
    parser.add_argument("--child", choices=["sb3"], help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--json", type=Path, default=None,
                        help="where the runs are saved (default: results/dqn_cartpole.json "
                             "at 50k steps, results/dqn_cartpole_<N>k.json at another "
                             "budget)")
    args = parser.parse_args()
    if args.json is None:
        name = "dqn_cartpole" + ("" if args.steps == DEFAULT_STEPS else
                                 f"_{args.steps // 1000}k")
        args.json = RESULTS / f"{name}.json"
    if args.child:
        print(json.dumps(run_sb3(args.steps, args.seed, args.eval_every)))
        return
    if args.quick:
        args.steps, args.seeds, args.eval_every = 5120, 1, 2560
    if args.report:
        saved = json.loads(args.json.read_text())
        args.steps = saved["settings"]["steps"]
        args.no_double_q_row = saved["settings"].get("no_double_q_row", False)
        args.compile_row = saved["settings"].get("compile_row", False)
        report(args, saved["runs"], saved["load"]["before"])
        return
    load_before = load_average()
    names = (("daskrl", "sb3") + (() if args.no_double_q_row else ("daskrl, double Q",))
             + (("daskrl --compile",) if args.compile_row else ()))
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    code = machine_info().get("git_commit")
    if args.json.exists() and not args.fresh and not args.quick:
        defaults = {k: parser.get_default(k) for k in SAME_SETTINGS}
        load_before, runs = kept_runs(args, names, defaults)
    for seed in range(1, args.seeds + 1):
        todo = [name for name in names if not any(r["seed"] == seed for r in runs[name])]
        for name in todo:
            load = load_average()["load_1m"]
            if name == "sb3":
                proc = subprocess.run([sys.executable, __file__, "--child", "sb3", "--seed",
                                       str(seed), "--steps", str(args.steps), "--eval-every",
                                       str(args.eval_every)], check=True, capture_output=True,
                                      text=True)
                run = json.loads(proc.stdout.strip().splitlines()[-1])
            else:
                run = run_daskrl(args.steps, seed, args.eval_every, "double Q" in name,
                                 name.endswith("--compile"))
            run.update(seed=seed, load_1m_before=load, load_1m_after=load_average()["load_1m"],
                       code=code)
            runs[name].append(run)
            print(f"seed {seed}: {name} {run['env_steps_per_s']:.0f} steps/s, to 475 "
                  f"{run['time_to_475_s']} s, load {load:.1f}", flush=True)
        if todo:  # a seed kept whole changes nothing: the JSON and the page stay as they are
            report(args, runs, load_before)


SAME_SETTINGS = ("steps", "eval_every", "no_double_q_row", "compile_row")
"""What a saved run must share with this call for the call to keep it."""


def kept_runs(args: argparse.Namespace, names: tuple[str, ...],
              defaults: dict[str, Any] | None = None
              ) -> tuple[dict[str, Any], dict[str, list[dict[str, Any]]]]:
    """The load before and the runs of ``args.json`` a call with the same settings keeps
    (all its seeds); one line naming ``--fresh`` when the settings differ. ``defaults``: the
    flags' defaults, for a JSON saved before a flag existed."""
    saved = json.loads(args.json.read_text())
    differ = [k for k in SAME_SETTINGS
              if saved["settings"].get(k, (defaults or {}).get(k)) != getattr(args, k)]
    if differ:
        raise SystemExit(f"{args.json} holds runs with another {', '.join(differ)}: add "
                         "--fresh to replace them, or --json to keep them")
    commit = saved.get("machine", {}).get("git_commit")
    runs = {name: [r | {"code": r.get("code", commit)} for r in saved["runs"].get(name, [])]
            for name in names}
    print(f"{args.json}: keeping seeds {sorted({r['seed'] for r in runs['sb3']})}",
          flush=True)
    return saved["load"]["before"], runs


READING = """
Reading: an iteration is 256 env steps and 128 gradient steps, so an env step costs half a
gradient step plus the acting. With both at the floor of the per-step table ("bare step":
forward, Huber loss, backward, fused Adam and the target's forward, nothing else) the most
any implementation can reach is about (SB3's gradient step / 2 + SB3's acting) / (bare step
/ 2 + daskrl's acting) times SB3's env-steps/s; the end-to-end rows above swing with the
machine's load from run to run, the per-step rows alternate within one process.
"""


def tables(runs: dict[str, list[dict[str, Any]]]) -> tuple[str, dict[str, Any], list[float]]:
    """The markdown table of one run's systems, their medians, and the 1-minute loads seen."""
    med = {name: {key: median([r[key] for r in rs]) for key in
                  ("env_steps_per_s", "time_to_475_s", "final_eval")}
           for name, rs in runs.items()}
    seeds = len(runs["sb3"])
    solved = {name: sum(r["time_to_475_s"] is not None for r in rs) for name, rs in runs.items()}
    loads = [r[k] for rs in runs.values() for r in rs for k in ("load_1m_before",
                                                                 "load_1m_after")]
    rows = [[name, fmt(m["env_steps_per_s"]),
             fmt(ratio(m["env_steps_per_s"], med["sb3"]["env_steps_per_s"])),
             ", ".join(f"{r['env_steps_per_s']:.0f}" for r in rs),
             ", ".join(fmt(r["env_steps_per_s"] / s["env_steps_per_s"])
                       for r, s in zip(rs, runs["sb3"], strict=False)),
             fmt(m["time_to_475_s"]), f"{solved[name]}/{seeds}", fmt(m["final_eval"])]
            for (name, m), rs in zip(med.items(), runs.values(), strict=True)]
    table = markdown_table(["system", "env-steps/s (median)", "x SB3", "per seed",
                            "x SB3's run of the same seed", "s to eval 475 (median of solved)",
                            "seeds solved", "final eval (median)"], rows)
    return table, med, loads


def report(args: argparse.Namespace, runs: dict[str, list[dict[str, Any]]],
           load_before: dict[str, Any]) -> None:
    """Print the table and (unless ``--quick``) write the JSON and ``dqn_cartpole.md``."""
    table, med, loads = tables(runs)
    speedup = ratio(med["daskrl"]["env_steps_per_s"], med["sb3"]["env_steps_per_s"])
    print(table)
    print(f"daskrl / SB3 env-steps/s: {fmt(speedup)}; load {min(loads):.1f}-{max(loads):.1f} "
          f"on {os.cpu_count()} CPUs")
    if args.quick:
        return
    if not args.report:
        write_json(args.json, {"runs": runs, "medians": med, "speedup": speedup,
                               "load": {"before": load_before, "after": load_average(),
                                        "range_1m": [min(loads), max(loads)]},
                               "machine": machine_info(), "settings": vars(args) | {
                                   "json": str(args.json)}})
    if args.json.resolve().parent != RESULTS.resolve():
        print(f"{args.json} is outside {RESULTS}: dqn_cartpole.md is left as it was")
        return
    (ROOT / "benchmarks" / "dqn_cartpole.md").write_text(page())


def run_line(data: dict[str, Any], link: str = "") -> str:
    """The command and the load of a saved run, as its section opens (``link``: the JSON's
    name, linked)."""
    settings, runs = data["settings"], data["runs"]
    _, _, loads = tables(runs)
    loads_per_seed = ", ".join(f"{r['load_1m_before']:.1f}" for rs in runs.values() for r in rs)
    flags = (" --no-double-q-row" if settings.get("no_double_q_row") else "") + (
        " --compile-row" if settings.get("compile_row") else "") + (
        f" --eval-every {settings['eval_every']}"
        if settings.get("eval_every", 5120) != 5120 else "")
    cpus = data["machine"].get("logical_cpus", "?")
    return (f"`python benchmarks/dqn_cartpole.py --seeds {len(runs['sb3'])} --steps "
            f"{settings['steps']}{flags}` "
            f"(1-minute load {min(loads):.1f}-{max(loads):.1f} on {cpus} CPUs, "
            f"at the start of each run: {loads_per_seed}; per seed the runs follow each other; "
            f"{_code(data)}{f'; [`results/{link}`](results/{link})' if link else ''})")


def page() -> str:
    """``dqn_cartpole.md`` from the saved runs: the 50k-step run, the earlier idle one, each
    other budget's, the per-step profile."""
    text = "# DQN on CartPole-v1: daskrl vs Stable-Baselines3 DQN\n\n"
    if MAIN.exists():
        data = json.loads(MAIN.read_text())
        text += (f"{run_line(data)}. Same settings on both sides (see the script's notes)."
                 f"\n\n{tables(data['runs'])[0]}\n")
    text += earlier_section(MAIN)
    for path in sorted(RESULTS.glob("dqn_cartpole_*k.json"),
                       key=lambda p: int(p.stem.rsplit("_", 1)[1][:-1])):
        data = json.loads(path.read_text())
        steps = data["settings"]["steps"]
        text += (f"\n## At {steps:,} steps\n\n{run_line(data, path.name)}."
                 f"\n\n{tables(data['runs'])[0]}\n")
    return text + profile_section(RESULTS / "dqn_profile.json") + READING


def earlier_section(path: Path) -> str:
    """The table of the earlier run on the idle machine (``results/dqn_cartpole_idle.json``),
    when this page's run is another one."""
    idle = path.parent / "dqn_cartpole_idle.json"
    if not idle.exists() or idle.resolve() == path.resolve():
        return ""
    data = json.loads(idle.read_text())
    table, _, loads = tables(data["runs"])
    flags = " --no-double-q-row" if data["settings"].get("no_double_q_row") else ""
    return (f"\n## The earlier run on the idle machine\n\n`python benchmarks/dqn_cartpole.py "
            f"--seeds {len(data['runs']['sb3'])} --steps {data['settings']['steps']}{flags}` "
            f"(1-minute load {min(loads):.1f}-{max(loads):.1f}; {_code(data)}; "
            f"[`results/dqn_cartpole_idle.json`](results/dqn_cartpole_idle.json)). On a loaded "
            f"machine the load changes between the runs that follow each other, and the ratio "
            f"of one seed's runs swings with it (the column \"x SB3's run of the same seed\" "
            f"above); this idle run is the one to read for speed.\n\n{table}\n")


if __name__ == "__main__":
    main()
