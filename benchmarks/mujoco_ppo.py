"""PPO on MuJoCo (Hopper-v5, HalfCheetah-v5) and Pendulum-v1: daskrl against Stable-Baselines3's
PPO with the same settings, in the same run.

Settings are CleanRL's ``ppo_continuous_action`` (= SB3 zoo's defaults for these envs without
tuning): 1 env, 2048 steps per rollout, 10 epochs of minibatch 64, lr 3e-4 annealed to 0,
gamma 0.99, GAE lambda 0.95, clip 0.2, no value clipping (SB3's default), entropy 0, value 0.5,
grad-norm 0.5, separate 64x64 tanh actor and critic, a state-independent log std, observation
normalisation and reward scaling (daskrl's running statistics; SB3's ``VecNormalize``), one torch
thread per process. daskrl runs ``daskrl train graphs/ppo.py`` (embedded LocalCluster,
``actors-learner``); SB3 runs ``PPO("MlpPolicy")`` on a ``VecNormalize``-d ``DummyVecEnv``. Each
run is its own process; the systems alternate. Both report the greedy return over 10 episodes
after training (SB3 with its normalisation statistics frozen) and env-steps/s (steps over the
wall time of training).

Usage::

    python benchmarks/mujoco_ppo.py --quick                     # smoke test, writes nothing
    python benchmarks/mujoco_ppo.py --steps 1000000 --seeds 0 1 2 --envs Hopper-v5 HalfCheetah-v5
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (  # noqa: E402
    ROOT,
    load_average,
    machine_info,
    markdown_table,
    median,
    ratio,
    update_section,
    write_json,
)

SETTINGS = {"num_envs": 1, "num_steps": 2048, "update_epochs": 10, "minibatch_size": 64,
            "learning_rate": 3e-4, "gamma": 0.99, "gae_lambda": 0.95, "clip_coef": 0.2,
            "ent_coef": 0.0, "vf_coef": 0.5, "max_grad_norm": 0.5, "hidden": 64,
            "clip_vloss": False}
"""``clip_vloss`` False is SB3's default (``clip_range_vf=None``); CleanRL's is True, and with
it SB3 gets ``clip_range_vf=clip_coef``."""

SB3_CHILD = r'''
import json, sys, time
import numpy as np, torch
torch.set_num_threads(1)
import gymnasium as gym
from stable_baselines3 import PPO
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.vec_env import VecNormalize
from stable_baselines3.common.callbacks import BaseCallback
env_id, steps, seed, s = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), json.loads(sys.argv[4])
evaluate = len(sys.argv) < 6 or sys.argv[5] != "--no-eval"
t0 = time.time()
raw = make_vec_env(env_id, n_envs=s["num_envs"], seed=seed)
env_s = [0.0]
step_wait = raw.step_wait
def timed_step_wait():
    t = time.perf_counter(); out = step_wait(); env_s[0] += time.perf_counter() - t
    return out
raw.step_wait = timed_step_wait
class Marks(BaseCallback):
    def __init__(self):
        super().__init__(); self.marks = []
    def _on_rollout_start(self):
        self.marks.append((time.perf_counter(), self.num_timesteps, env_s[0]))
    def _on_rollout_end(self):
        self.marks.append((time.perf_counter(), self.num_timesteps, env_s[0]))
    def _on_step(self):
        return True
marks = Marks()
env = VecNormalize(raw, gamma=s["gamma"])
lr = s["learning_rate"]
model = PPO("MlpPolicy", env, n_steps=s["num_steps"], batch_size=s["minibatch_size"],
            n_epochs=s["update_epochs"], learning_rate=lambda p: lr * p, gamma=s["gamma"],
            gae_lambda=s["gae_lambda"], clip_range=s["clip_coef"], ent_coef=s["ent_coef"],
            vf_coef=s["vf_coef"], max_grad_norm=s["max_grad_norm"], seed=seed, device="cpu",
            clip_range_vf=s["clip_coef"] if s.get("clip_vloss") else None,
            policy_kwargs={"net_arch": {"pi": [s["hidden"]] * 2, "vf": [s["hidden"]] * 2},
                           "activation_fn": torch.nn.Tanh, "log_std_init": 0.0})
t1 = time.time()
model.learn(steps, callback=marks)
t2 = time.time()
m = marks.marks + [(time.perf_counter(), model.num_timesteps, env_s[0])]
its = [{"wall_s": m[i + 2][0], "steps": m[i + 1][1] - m[i][1], "env_s": m[i + 1][2] - m[i][2],
        "inference_s": m[i + 1][0] - m[i][0] - (m[i + 1][2] - m[i][2]),
        "learn_s": m[i + 2][0] - m[i + 1][0]} for i in range(0, len(m) - 2, 2)]
env.training, env.norm_reward = False, False
returns = []
for ep in range(10 if evaluate else 0):
    e = gym.make(env_id); obs, _ = e.reset(seed=10_000 + ep); done, total = False, 0.0
    while not done:
        a, _ = model.predict(env.normalize_obs(obs[None]), deterministic=True)
        obs, r, term, trunc, _ = e.step(a[0]); total += r; done = term or trunc
    returns.append(total)
print("RESULT " + json.dumps({"env_steps": model.num_timesteps, "train_s": t2 - t1,
                              "wall_s": t2 - t0, "iterations": its,
                              "eval_return_mean": float(np.mean(returns)) if returns else None}))
'''


def _env() -> dict[str, str]:
    env = dict(os.environ)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[var] = "1"
    return env


def steady(its: list[dict[str, float]]) -> dict[str, Any]:
    """Env-steps/s and seconds per iteration by part, after the first iteration (warm-up).

    ``its``: per iteration ``wall_s`` (its end, on one clock), ``steps``, ``env_s`` (inside
    the envs' step), ``inference_s`` (the rest of the rollout: the policy, normalisation,
    buffers) and ``learn_s`` (the update).

    Examples
    --------
    >>> its = [{"wall_s": t, "steps": 10, "env_s": 0.2, "inference_s": 0.1, "learn_s": 0.5}
    ...        for t in (1.0, 2.0, 3.0)]
    >>> steady(its)["env_steps_per_s"], steady(its)["per_iteration_s"]["total"]
    (10.0, 1.0)
    """
    rest = its[1:]
    span = its[-1]["wall_s"] - its[0]["wall_s"]
    parts = {k: median(it[k] for it in rest) for k in ("env_s", "inference_s", "learn_s")}
    total = span / len(rest)
    parts["other_s"] = total - sum(parts.values())  # scheduling, transfers, logging
    return {"steady_env_steps": sum(it["steps"] for it in rest),
            "env_steps_per_s": sum(it["steps"] for it in rest) / span,
            "per_iteration_s": {**parts, "total": total}}


def run_daskrl(env_id: str, steps: int, seed: int, out: Path, timeout: float,
               evaluate: bool = True, extra: tuple[str, ...] = ()) -> dict[str, Any]:
    """One ``daskrl train`` run (``extra``: more of its flags); its summary's speed and
    final greedy return (and, with ``evaluate=False``, no evaluation but the steady speed and
    its parts)."""
    s = SETTINGS
    cmd = [sys.executable, "-m", "daskrl", "train", "graphs/ppo.py", "--env", env_id,
           "--steps", str(steps), "--seed", str(seed), "--out", str(out), "--no-progress",
           "--clip-vloss" if s["clip_vloss"] else "--no-clip-vloss",
           *([] if evaluate else ["--no-eval"]), *extra]
    for key in ("num_envs", "num_steps", "update_epochs", "minibatch_size", "learning_rate",
                "gamma", "gae_lambda", "clip_coef", "ent_coef", "vf_coef", "max_grad_norm",
                "hidden"):
        cmd += ["--" + key.replace("_", "-"), str(s[key])]
    t0 = time.time()
    proc = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True,
                          timeout=timeout)
    if proc.returncode:
        raise RuntimeError(f"daskrl run failed: {proc.stderr[-2000:]}")
    summary = json.loads((out / "summary.json").read_text())
    res = {"env_steps": summary["env_steps"], "train_s": summary["wall_s"],
           "wall_s": time.time() - t0, "eval_return_mean": summary.get("eval_return_mean"),
           "env_steps_per_s": summary["env_steps"] / summary["wall_s"]}
    if not evaluate:
        with (out / "metrics.csv").open() as fh:
            its = [{"wall_s": float(r["wall_s"]), "steps": int(float(r["iteration_env_steps"])),
                    **{k: float(r[k]) for k in ("env_s", "inference_s", "learn_s")}}
                   for r in csv.DictReader(fh)]
        res["steady"] = steady(its)
    return res


def run_sb3(env_id: str, steps: int, seed: int, timeout: float, evaluate: bool = True
            ) -> dict[str, Any]:
    """One SB3 PPO run in its own process."""
    proc = subprocess.run([sys.executable, "-c", SB3_CHILD, env_id, str(steps), str(seed),
                           json.dumps(SETTINGS), "" if evaluate else "--no-eval"], cwd=ROOT,
                          env=_env(), capture_output=True, text=True, timeout=timeout)
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode or not line:
        raise RuntimeError(f"SB3 run failed: {proc.stderr[-2000:]}")
    out = json.loads(line[0][7:])
    out["env_steps_per_s"] = out["env_steps"] / out["train_s"]
    its = out.pop("iterations")
    if not evaluate:
        out["steady"] = steady(its)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--envs", nargs="+", default=["Hopper-v5", "HalfCheetah-v5"])
    parser.add_argument("--steps", type=int, default=1_000_000, help="env steps per run")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--timeout", type=float, default=4 * 3600, help="seconds per run")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                        help="override settings for both systems, e.g. gamma=0.9 num_envs=4")
    parser.add_argument("--systems", nargs="+", default=["daskrl", "sb3"],
                        choices=["daskrl", "sb3"], help="which systems to run")
    parser.add_argument("--speed", action="store_true",
                        help="speed only: no evaluation; env-steps/s after the first iteration "
                        "and seconds per iteration by part (results/mujoco_ppo_speed.json)")
    parser.add_argument("--cpu", action="store_true",
                        help="thread CPU seconds per iteration by part, daskrl's roles in a "
                        "plain loop vs SB3's (each seed a repeat; --steps: iterations x 2048)")
    parser.add_argument("--quick", action="store_true", help="4096 steps, 1 seed, no output")
    parser.add_argument("--daskrl-args", default="",
                        help="more flags for daskrl's runs, e.g. \"--vtrace --distribution "
                        "actors-learner:stale=1\" (recorded with the settings)")
    parser.add_argument("--json", type=Path, default=ROOT / "benchmarks/results/mujoco_ppo.json")
    args = parser.parse_args()
    if args.quick:
        args.steps, args.seeds = 4096, args.seeds[:1]
    if args.speed and args.json == parser.get_default("json"):
        args.json = args.json.with_name("mujoco_ppo_speed.json")
    for item in args.set:
        key, value = item.split("=", 1)
        SETTINGS[key] = (value.lower() in ("1", "true", "yes") if isinstance(SETTINGS[key], bool)
                         else type(SETTINGS[key])(value))
    if args.cpu:  # after --set: the CPU runs take the same settings
        if args.json == parser.get_default("json"):
            args.json = args.json.with_name("mujoco_ppo_cpu.json")
        return cpu_main(args)
    extra = tuple(shlex.split(args.daskrl_args))
    settings = {**SETTINGS, **({"daskrl_args": args.daskrl_args} if extra else {})}
    record: dict[str, Any] = {"settings": settings, "steps": args.steps, "seeds": args.seeds,
                              "machine": machine_info(), "load_before": load_average(),
                              "runs": []}
    tmp = Path(os.environ.get("TMPDIR", "/tmp")) / f"mujoco_ppo-{os.getpid()}"
    for env_id in args.envs:
        for i, seed in enumerate(args.seeds):
            order = ["daskrl", "sb3"] if i % 2 == 0 else ["sb3", "daskrl"]
            for system in [x for x in order if x in args.systems]:
                load = os.getloadavg()[0]
                if system == "daskrl":
                    res = run_daskrl(env_id, args.steps, seed, tmp / f"{env_id}-{seed}",
                                     args.timeout, evaluate=not args.speed, extra=extra)
                else:
                    res = run_sb3(env_id, args.steps, seed, args.timeout,
                                  evaluate=not args.speed)
                res.update(system=system, env=env_id, seed=seed, load_1min_before=load)
                record["runs"].append(res)
                print(json.dumps(res), flush=True)
                if not args.quick:  # after every run: a long benchmark's partial results survive
                    write_json(args.json, record)
    record["load_after"] = load_average()
    if args.quick:
        return
    write_json(args.json, record)
    (report_speed if args.speed else report)(record, args.json)


def cpu_main(args: argparse.Namespace) -> None:
    """``--cpu``: per-iteration CPU seconds of both systems, alternating, and the page's
    section."""
    from _ppo_cpu import run_cpu

    iterations = max(2, args.steps // (SETTINGS["num_steps"] * SETTINGS["num_envs"]))
    record: dict[str, Any] = {"settings": SETTINGS, "iterations": iterations,
                              "repeats": len(args.seeds), "machine": machine_info(),
                              "load_before": load_average(), "runs": []}
    for env_id in args.envs:
        for i in range(len(args.seeds)):
            for system in ["daskrl", "sb3"] if i % 2 == 0 else ["sb3", "daskrl"]:
                res = run_cpu(system, env_id, iterations, SETTINGS, ROOT, _env(), args.timeout)
                record["runs"].append(res)
                print(json.dumps({k: v for k, v in res.items() if k != "iterations"}),
                      flush=True)
    record["load_after"] = load_average()
    if args.quick:
        return
    write_json(args.json, record)
    rows = []
    for env_id in args.envs:
        med = {s: {k: median(r[k] for r in record["runs"] if r["env"] == env_id
                             and r["system"] == s)
                   for k in ("rollout_cpu_s", "update_cpu_s", "iteration_cpu_s",
                             "env_steps_per_cpu_s")} for s in ("daskrl", "sb3")}
        for s in ("daskrl", "sb3"):
            rows.append([env_id, "daskrl" if s == "daskrl" else "SB3", med[s]["rollout_cpu_s"],
                         med[s]["update_cpu_s"], med[s]["iteration_cpu_s"],
                         med[s]["env_steps_per_cpu_s"],
                         ratio(med[s]["env_steps_per_cpu_s"], med["sb3"]["env_steps_per_cpu_s"])])
    loads = [r["load_1min_before"] for r in record["runs"]]
    body = "\n\n".join([
        "## CPU seconds per iteration: daskrl's roles vs Stable-Baselines3",
        "Thread CPU seconds (``time.thread_time``) of each iteration's rollout (2,048 env "
        "steps: envs, policy, normalisation, buffers, GAE) and update (10 epochs x 32 "
        "minibatches), daskrl's actor and learner (``graphs/ppo.py``'s roles) called in a plain "
        "loop (no Dask: what the tasks run) against SB3's ``collect_rollouts`` and ``train``, "
        f"same settings as above (clip_vloss={SETTINGS['clip_vloss']}). Median over "
        f"{iterations} iterations after a warm-up one, then over {len(args.seeds)} processes "
        f"per system (alternating); 1-minute load average {min(loads):.1f}-{max(loads):.1f}. "
        "CPU time is far less sensitive to the other jobs on this shared machine than wall "
        "time (contention for the cores' caches still inflates it).",
        markdown_table(["env", "system", "rollout CPU s", "update CPU s", "iteration CPU s",
                        "env-steps per CPU s", "/ SB3"], rows),
        f"Raw runs: [`results/{args.json.name}`](results/{args.json.name}).",
    ])
    update_section(ROOT / "benchmarks/mujoco_ppo.md", args.json.stem, body)


def report_speed(record: dict[str, Any], path: Path) -> None:
    """The speed section of ``benchmarks/mujoco_ppo.md``: steady env-steps/s and where an
    iteration's time goes, per system."""
    rows = []
    for env_id in dict.fromkeys(r["env"] for r in record["runs"]):
        by = {s: [r["steady"] for r in record["runs"] if r["env"] == env_id and r["system"] == s]
              for s in ("daskrl", "sb3")}
        med = {s: {k: median(r["env_steps_per_s"] for r in rs) if k == "rate" else
                   median(r["per_iteration_s"][k] for r in rs)
                   for k in ("rate", "env_s", "inference_s", "learn_s", "other_s", "total")}
               for s, rs in by.items()}
        for s in ("daskrl", "sb3"):
            m = med[s]
            rows.append([env_id, "daskrl" if s == "daskrl" else "SB3", len(by[s]), m["rate"],
                         ratio(m["rate"], med["sb3"]["rate"]), m["env_s"], m["inference_s"],
                         m["learn_s"], m["other_s"], m["total"]])
    loads = [r["load_1min_before"] for r in record["runs"]]
    body = "\n\n".join([
        "## Speed: where an iteration's time goes, daskrl vs Stable-Baselines3",
        "Settings: " + ", ".join(f"{k}={v}" for k, v in record["settings"].items()) + ".",
        f"Env steps per run: {record['steps']:,} (no evaluation); env-steps/s over the "
        "iterations after the first (warm-up: worker start, imports, the first rollout); "
        f"runs alternate between the systems; seeds {record['seeds']}; 1-minute load average "
        f"before each run {min(loads):.1f}-{max(loads):.1f} (machine: "
        f"{record['machine']['usable_cpus']} usable CPUs, shared). Seconds per iteration "
        "(2,048 steps): *env* inside the envs' step (gymnasium's env and its wrappers), "
        "*inference* daskrl: the policy's forward pass, sampling and observation "
        "normalisation (its actors' ``inference_s``); SB3: the rest of the rollout (policy, "
        "``VecNormalize``, buffers, GAE), *update* 10 epochs x 32 minibatches, *other* the "
        "rest (daskrl: its rollout bookkeeping (buffers, reward scaling, GAE), Dask "
        "scheduling, transfers, metrics; SB3: its logger).",
        markdown_table(["env", "system", "runs", "env-steps/s", "/ SB3", "env s",
                        "inference s", "update s", "other s", "iteration s"], rows),
        f"Medians over runs. Raw runs: [`results/{path.name}`](results/{path.name}).",
    ])
    update_section(ROOT / "benchmarks/mujoco_ppo.md", path.stem, body)


def report(record: dict[str, Any], path: Path) -> None:
    """The markdown page ``benchmarks/mujoco_ppo.md`` from a recorded run."""
    rows = []
    for env_id in dict.fromkeys(r["env"] for r in record["runs"]):
        by = {s: [r for r in record["runs"] if r["env"] == env_id and r["system"] == s]
              for s in ("daskrl", "sb3")}
        med = {s: {k: median(r[k] for r in rs) for k in ("env_steps_per_s", "eval_return_mean",
                                                         "wall_s")} for s, rs in by.items()}
        rows.append([env_id, max(len(rs) for rs in by.values()), med["daskrl"]["env_steps_per_s"],
                     med["sb3"]["env_steps_per_s"],
                     ratio(med["daskrl"]["env_steps_per_s"], med["sb3"]["env_steps_per_s"]),
                     med["daskrl"]["eval_return_mean"], med["sb3"]["eval_return_mean"],
                     med["daskrl"]["wall_s"], med["sb3"]["wall_s"]])
    loads = [r["load_1min_before"] for r in record["runs"]]
    body = "\n\n".join([
        f"## PPO on {', '.join(dict.fromkeys(r['env'] for r in record['runs']))}: daskrl vs "
        "Stable-Baselines3",
        "Settings: " + ", ".join(f"{k}={v}" for k, v in record["settings"].items()) + ".",
        f"Env steps per run: {record['steps']:,}; seeds {record['seeds']}; 1-minute load "
        f"average before each run {min(loads):.1f}-{max(loads):.1f} (machine: "
        f"{record['machine']['usable_cpus']} usable CPUs, shared).",
        markdown_table(["env", "seeds", "daskrl env-steps/s", "SB3 env-steps/s",
                        "daskrl / SB3", "daskrl eval return", "SB3 eval return",
                        "daskrl wall s", "SB3 wall s"], rows),
        f"Medians over seeds. Raw runs: [`results/{path.name}`](results/{path.name}).",
    ])
    page = ROOT / "benchmarks/mujoco_ppo.md"
    if not page.exists():
        page.write_text("# PPO on continuous control\n\n" + (__doc__ or "").split("Usage::")[0]
                        .strip() + "\n")
    update_section(page, path.stem, body)


if __name__ == "__main__":
    main()
