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
import json
import os
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
            "ent_coef": 0.0, "vf_coef": 0.5, "max_grad_norm": 0.5, "hidden": 64}

SB3_CHILD = r'''
import json, sys, time
import numpy as np, torch
torch.set_num_threads(1)
import gymnasium as gym
from stable_baselines3 import PPO
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.vec_env import VecNormalize
env_id, steps, seed, s = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), json.loads(sys.argv[4])
t0 = time.time()
env = VecNormalize(make_vec_env(env_id, n_envs=s["num_envs"], seed=seed), gamma=s["gamma"])
lr = s["learning_rate"]
model = PPO("MlpPolicy", env, n_steps=s["num_steps"], batch_size=s["minibatch_size"],
            n_epochs=s["update_epochs"], learning_rate=lambda p: lr * p, gamma=s["gamma"],
            gae_lambda=s["gae_lambda"], clip_range=s["clip_coef"], ent_coef=s["ent_coef"],
            vf_coef=s["vf_coef"], max_grad_norm=s["max_grad_norm"], seed=seed, device="cpu",
            policy_kwargs={"net_arch": {"pi": [s["hidden"]] * 2, "vf": [s["hidden"]] * 2},
                           "activation_fn": torch.nn.Tanh, "log_std_init": 0.0})
t1 = time.time()
model.learn(steps)
t2 = time.time()
env.training, env.norm_reward = False, False
returns = []
for ep in range(10):
    e = gym.make(env_id); obs, _ = e.reset(seed=10_000 + ep); done, total = False, 0.0
    while not done:
        a, _ = model.predict(env.normalize_obs(obs[None]), deterministic=True)
        obs, r, term, trunc, _ = e.step(a[0]); total += r; done = term or trunc
    returns.append(total)
print("RESULT " + json.dumps({"env_steps": model.num_timesteps, "train_s": t2 - t1,
                              "wall_s": t2 - t0, "eval_return_mean": float(np.mean(returns))}))
'''


def _env() -> dict[str, str]:
    env = dict(os.environ)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[var] = "1"
    return env


def run_daskrl(env_id: str, steps: int, seed: int, out: Path, timeout: float) -> dict[str, Any]:
    """One ``daskrl train`` run; its summary's speed and final greedy return."""
    s = SETTINGS
    cmd = [sys.executable, "-m", "daskrl", "train", "graphs/ppo.py", "--env", env_id,
           "--steps", str(steps), "--seed", str(seed), "--out", str(out), "--no-progress",
           "--no-clip-vloss"]
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
    return {"env_steps": summary["env_steps"], "train_s": summary["wall_s"],
            "wall_s": time.time() - t0, "eval_return_mean": summary.get("eval_return_mean"),
            "env_steps_per_s": summary["env_steps"] / summary["wall_s"]}


def run_sb3(env_id: str, steps: int, seed: int, timeout: float) -> dict[str, Any]:
    """One SB3 PPO run in its own process."""
    proc = subprocess.run([sys.executable, "-c", SB3_CHILD, env_id, str(steps), str(seed),
                           json.dumps(SETTINGS)], cwd=ROOT, env=_env(), capture_output=True,
                          text=True, timeout=timeout)
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode or not line:
        raise RuntimeError(f"SB3 run failed: {proc.stderr[-2000:]}")
    out = json.loads(line[0][7:])
    out["env_steps_per_s"] = out["env_steps"] / out["train_s"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--envs", nargs="+", default=["Hopper-v5", "HalfCheetah-v5"])
    parser.add_argument("--steps", type=int, default=1_000_000, help="env steps per run")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--timeout", type=float, default=4 * 3600, help="seconds per run")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                        help="override settings for both systems, e.g. gamma=0.9 num_envs=4")
    parser.add_argument("--quick", action="store_true", help="4096 steps, 1 seed, no output")
    parser.add_argument("--json", type=Path, default=ROOT / "benchmarks/results/mujoco_ppo.json")
    args = parser.parse_args()
    if args.quick:
        args.steps, args.seeds = 4096, args.seeds[:1]
    for item in args.set:
        key, value = item.split("=", 1)
        SETTINGS[key] = type(SETTINGS[key])(value)
    record: dict[str, Any] = {"settings": SETTINGS, "steps": args.steps, "seeds": args.seeds,
                              "machine": machine_info(), "load_before": load_average(),
                              "runs": []}
    tmp = Path(os.environ.get("TMPDIR", "/tmp")) / f"mujoco_ppo-{os.getpid()}"
    for env_id in args.envs:
        for i, seed in enumerate(args.seeds):
            order = ["daskrl", "sb3"] if i % 2 == 0 else ["sb3", "daskrl"]
            for system in order:
                load = os.getloadavg()[0]
                if system == "daskrl":
                    res = run_daskrl(env_id, args.steps, seed, tmp / f"{env_id}-{seed}",
                                     args.timeout)
                else:
                    res = run_sb3(env_id, args.steps, seed, args.timeout)
                res.update(system=system, env=env_id, seed=seed, load_1min_before=load)
                record["runs"].append(res)
                print(json.dumps(res), flush=True)
    record["load_after"] = load_average()
    if args.quick:
        return
    write_json(args.json, record)
    report(record, args.json)


def report(record: dict[str, Any], path: Path) -> None:
    """The markdown page ``benchmarks/mujoco_ppo.md`` from a recorded run."""
    rows = []
    for env_id in dict.fromkeys(r["env"] for r in record["runs"]):
        by = {s: [r for r in record["runs"] if r["env"] == env_id and r["system"] == s]
              for s in ("daskrl", "sb3")}
        med = {s: {k: median(r[k] for r in rs) for k in ("env_steps_per_s", "eval_return_mean",
                                                         "wall_s")} for s, rs in by.items()}
        rows.append([env_id, len(by["daskrl"]), med["daskrl"]["env_steps_per_s"],
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
