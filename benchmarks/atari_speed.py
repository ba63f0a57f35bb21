"""Atari rollout speed: gymnasium's vector env against EnvPool, and PPO end to end against
Stable-Baselines3's ``PPO("CnnPolicy")``, in the same run.

- *env only*: env-steps/s of random actions on Breakout (gymnasium:
  ``BreakoutNoFrameskip-v4`` with ``AtariPreprocessing`` and 4 stacked frames in a synchronous
  vector env; EnvPool: ``Breakout-v5``, the same preprocessing in C++ threads).
- *rollout fragment*: env-steps/s of daskrl's rollout fragment (``VecEnvActor.rollout(128)``:
  the envs and the Nature-DQN CNN choosing every action) with either backend.
- *bytes per rollout*: what one actor's batch weighs on the wire (uint8 frames), and what
  float32 frames would weigh.
- *end to end* (``--e2e``): frames/s (env steps x 4 skipped frames) of ``daskrl train
  graphs/ppo.py`` and of SB3's ``PPO("CnnPolicy")`` with the same settings (8 envs x 128 steps,
  4 epochs of minibatch 256, CPU). daskrl as it runs by default (its learner takes the idle
  core while the rollout waits when that is faster, ``daskrl.core.learner_threads``) and
  with its update held to one torch thread (``--distribution actors-learner:threads=1``);
  SB3 with one torch thread and with torch's default (every core).

Usage::

    python benchmarks/atari_speed.py --quick          # smoke test, writes nothing
    python benchmarks/atari_speed.py --repeats 3 --e2e
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

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

GYM_ID = "BreakoutNoFrameskip-v4"
FRAME_SKIP = 4

SB3_CHILD = r'''
import json, sys, time
import os
import torch
threads = int(sys.argv[3])  # 0: every usable core, as torch starts without OMP_NUM_THREADS
torch.set_num_threads(threads or len(os.sched_getaffinity(0)))
import ale_py, gymnasium
gymnasium.register_envs(ale_py)
from stable_baselines3 import PPO
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_atari_env
from stable_baselines3.common.vec_env import VecFrameStack
steps, envs = int(sys.argv[1]), int(sys.argv[2])
env = VecFrameStack(make_atari_env("BreakoutNoFrameskip-v4", n_envs=envs, seed=0), 4)
env_s = [0.0]
step_wait = env.step_wait  # SB3 wraps env (VecTransposeImage), which calls this
def timed_step_wait():
    t = time.perf_counter(); out = step_wait(); env_s[0] += time.perf_counter() - t
    return out
env.step_wait = timed_step_wait
class Marks(BaseCallback):
    def __init__(self):
        super().__init__(); self.marks = []
    def _on_rollout_start(self):
        self.marks.append(("start", time.perf_counter(), self.num_timesteps, env_s[0]))
    def _on_rollout_end(self):
        self.marks.append(("end", time.perf_counter(), self.num_timesteps, env_s[0]))
    def _on_step(self):
        return True
model = PPO("CnnPolicy", env, n_steps=128, batch_size=256, n_epochs=4, learning_rate=2.5e-4,
            clip_range=0.1, ent_coef=0.01, vf_coef=0.5, device="cpu", seed=0)
marks = Marks()
t0 = time.time()
model.learn(steps, callback=marks)
t_end = time.perf_counter()
starts = [m for m in marks.marks if m[0] == "start"] + [("start", t_end, model.num_timesteps, 0)]
ends = [m for m in marks.marks if m[0] == "end"]
its = [{"t0": s[1], "t1": e[1], "t_next": n[1], "steps": e[2] - s[2], "env_s": e[3] - s[3]}
       for s, e, n in zip(starts, ends, starts[1:])]
print("RESULT " + json.dumps({"env_steps": model.num_timesteps, "train_s": time.time() - t0,
                              "iterations": its}))
'''


def _threads_env() -> dict[str, str]:
    env = dict(os.environ)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[var] = "1"
    return env


def env_only(backend: str, num_envs: int, steps: int) -> float:
    """Env-steps/s of random actions (the vector env alone)."""
    from daskrl.core.envs import make_vector_env

    env = make_vector_env(GYM_ID, num_envs, seed=0, backend=backend)  # type: ignore[arg-type]
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    n = int(env.single_action_space.n)
    env.step(rng.integers(0, n, num_envs))
    t0 = time.perf_counter()
    for _ in range(steps):
        env.step(rng.integers(0, n, num_envs))
    elapsed = time.perf_counter() - t0
    env.close()
    return steps * num_envs / elapsed


def fragment(backend: str, num_envs: int, steps: int) -> dict[str, float]:
    """Env-steps/s of ``VecEnvActor.rollout`` (envs and CNN inference) and its batch's bytes."""
    import torch

    from daskrl.algos.actor_critic import VecEnvActor

    torch.set_num_threads(1)
    actor = VecEnvActor(GYM_ID, num_envs, seed=0, backend=backend)  # type: ignore[arg-type]
    actor.rollout(4)  # builds the envs
    t0 = time.perf_counter()
    batch = actor.rollout(steps)
    elapsed = time.perf_counter() - t0
    actor.close()
    arrays = [v for k, v in batch.items() if isinstance(v, np.ndarray)]
    obs = batch["obs"]
    return {"env_steps_per_s": batch["stats"]["env_steps"] / elapsed,
            "batch_bytes": sum(a.nbytes for a in arrays),
            "batch_bytes_if_float32": sum(a.nbytes for a in arrays) + 3 * obs.nbytes,
            "obs_dtype": str(obs.dtype), "transitions": len(obs)}


def e2e_daskrl(steps: int, out: Path, backend: str, *extra: str) -> dict[str, Any]:
    """``daskrl train graphs/ppo.py`` on Breakout; per-iteration times from ``metrics.csv``."""
    cmd = [sys.executable, "-m", "daskrl", "train", "graphs/ppo.py", "--env", GYM_ID,
           "--steps", str(steps), "--num-envs", "8", "--num-steps", "128",
           "--minibatch-size", "256", "--clip-coef", "0.1", "--no-clip-vloss",
           "--env-backend", backend, "--out", str(out), "--no-progress", "--no-eval", *extra]
    proc = subprocess.run(cmd, cwd=ROOT, env=_threads_env(), capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(proc.stderr[-2000:])
    summary = json.loads((out / "summary.json").read_text())
    with (out / "metrics.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    its = [{"wall_s": float(r["wall_s"]), "steps": int(float(r["iteration_env_steps"])),
            "env_s": float(r["env_s"]), "inference_s": float(r["inference_s"]),
            "learn_s": float(r["learn_s"])} for r in rows]
    return {"env_steps": summary["env_steps"], "train_s": summary["wall_s"],
            "learner_threads": summary.get("learner_threads"), **_steady(its)}


def _steady(its: list[dict[str, float]]) -> dict[str, Any]:
    """Frames/s and seconds per iteration by part, after the first iteration (warm-up).

    ``its``: per iteration ``wall_s`` (end, on one clock), ``steps``, ``env_s``, and either
    ``inference_s``/``learn_s`` (daskrl) or ``rollout_s``/``learn_s`` (SB3).
    """
    rest = its[1:]
    span = its[-1]["wall_s"] - its[0]["wall_s"]
    steps = sum(it["steps"] for it in rest)
    parts = {k: median(it[k] for it in rest)
             for k in ("env_s", "inference_s", "learn_s") if k in rest[0]}
    return {"steady_env_steps": steps, "steady_s": span,
            "frames_per_s": FRAME_SKIP * steps / span,
            "per_iteration_s": {**parts, "total": span / len(rest)}}


def e2e_sb3(steps: int, threads: int = 1) -> dict[str, Any]:
    """SB3's ``PPO("CnnPolicy")`` on Breakout with ``threads`` torch threads (0: every
    usable core, torch's default); per-iteration times from callbacks."""
    proc = subprocess.run([sys.executable, "-c", SB3_CHILD, str(steps), "8", str(threads)],
                          cwd=ROOT, env=_threads_env(), capture_output=True, text=True)
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode or not line:
        raise RuntimeError(proc.stderr[-2000:])
    res = json.loads(line[0][7:])
    its = [{"wall_s": it["t_next"], "steps": it["steps"], "env_s": it["env_s"],
            "inference_s": it["t1"] - it["t0"] - it["env_s"], "learn_s": it["t_next"] - it["t1"]}
           for it in res.pop("iterations")]
    return {**res, **_steady(its)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--envs", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--steps", type=int, default=128, help="vector steps per measurement")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--e2e", action="store_true", help="also PPO end to end against SB3")
    parser.add_argument("--e2e-steps", type=int, default=9 * 1024,
                        help="env steps per end-to-end run (8 envs x 128 per iteration; the "
                        "first iteration is warm-up, left out of frames/s)")
    parser.add_argument("--only-e2e", action="store_true", help="skip the env/fragment part")
    parser.add_argument("--quick", action="store_true", help="1 repeat, 16 steps, no output")
    parser.add_argument("--json", type=Path, default=ROOT / "benchmarks/results/atari_speed.json")
    args = parser.parse_args()
    if args.quick:
        args.repeats, args.steps, args.envs = 1, 16, args.envs[:1]
    try:
        import envpool  # noqa: F401
        backends = ["gymnasium", "envpool"]
    except ImportError:
        backends = ["gymnasium"]
    from daskrl.core.envs import usable_cpus

    record: dict[str, Any] = {"steps": args.steps, "repeats": args.repeats,
                              "envpool_threads": {n: min(n, usable_cpus()) for n in args.envs},
                              "machine": machine_info(["envpool", "ale-py", "torch",
                                                       "gymnasium", "stable-baselines3"]),
                              "load_before": load_average(), "runs": []}
    for rep in range(0 if args.only_e2e else args.repeats):
        for num_envs in args.envs:
            for backend in backends if rep % 2 == 0 else backends[::-1]:
                row = {"repeat": rep, "num_envs": num_envs, "backend": backend,
                       "load_1min": os.getloadavg()[0],
                       "env_only_steps_per_s": env_only(backend, num_envs, args.steps)}
                row.update(fragment(backend, num_envs, args.steps))
                record["runs"].append(row)
                print(json.dumps(row), flush=True)
    if args.e2e:
        tmp = Path(os.environ.get("TMPDIR", "/tmp")) / f"atari_speed-{os.getpid()}"
        record["e2e"] = []
        for rep in range(args.repeats):
            systems = ["daskrl", "daskrl-1-thread",
                       *(["daskrl-envpool"] if "envpool" in backends else []), "sb3",
                       "sb3-all-threads"]
            for system in systems if rep % 2 == 0 else systems[::-1]:
                load = os.getloadavg()[0]
                backend = "envpool" if system.endswith("envpool") else "gymnasium"
                extra = (("--distribution", "actors-learner:threads=1")
                         if system == "daskrl-1-thread" else ())
                try:
                    res = (e2e_sb3(args.e2e_steps, 0 if system == "sb3-all-threads" else 1)
                           if system.startswith("sb3") else
                           e2e_daskrl(args.e2e_steps, tmp / f"{system}-{rep}", backend, *extra))
                except RuntimeError as exc:  # keep the rollout numbers measured so far
                    print(f"{system} failed: {exc}", file=sys.stderr)
                    continue
                res.update(system=system, repeat=rep, load_1min=load,
                           frames_per_s=FRAME_SKIP * res["env_steps"] / res["train_s"])
                record["e2e"].append(res)
                print(json.dumps(res), flush=True)
    record["load_after"] = load_average()
    if args.quick:
        return
    if args.only_e2e and args.json.exists():  # the env and fragment rows measured before
        before = json.loads(args.json.read_text())
        record["runs"], record["envpool_threads"] = before["runs"], before["envpool_threads"]
        record["env_rows_load"] = before.get("env_rows_load", before["load_before"]["load_1m"])
        record["note"] = (f"The env and fragment rows are from an earlier call (load "
                          f"{record['env_rows_load']:.1f} at its start); the end-to-end rows "
                          "from this one (`--only-e2e`).")
    write_json(args.json, record)
    report(record)


def report(record: dict[str, Any]) -> None:
    """``benchmarks/atari_speed.md`` from a recorded run."""
    runs = record["runs"]
    rows = []
    for num_envs in dict.fromkeys(r["num_envs"] for r in runs):
        med = {(b, k): median(r[k] for r in runs if r["num_envs"] == num_envs
                              and r["backend"] == b)
               for b in ("gymnasium", "envpool")
               for k in ("env_only_steps_per_s", "env_steps_per_s", "batch_bytes",
                         "batch_bytes_if_float32")}
        rows.append([num_envs, med["gymnasium", "env_only_steps_per_s"],
                     med["envpool", "env_only_steps_per_s"],
                     ratio(med["envpool", "env_only_steps_per_s"],
                           med["gymnasium", "env_only_steps_per_s"]),
                     med["gymnasium", "env_steps_per_s"], med["envpool", "env_steps_per_s"],
                     ratio(med["envpool", "env_steps_per_s"], med["gymnasium", "env_steps_per_s"]),
                     med["gymnasium", "batch_bytes"] / 2**20,
                     med["gymnasium", "batch_bytes_if_float32"] / 2**20])
    loads = [r["load_1min"] for r in runs] + [r["load_1min"] for r in record.get("e2e", [])]
    parts = [
        "# Atari rollout speed",
        (__doc__ or "").split("Usage::")[0].strip(),
        f"{record['steps']} vector steps per measurement, medians of {record['repeats']}; "
        f"1-minute load average {min(loads):.1f}-{max(loads):.1f} on "
        f"{record['machine']['usable_cpus']} shared CPUs. EnvPool runs "
        + ", ".join(f"{t} threads at {n} envs"
                    for n, t in record.get("envpool_threads", {}).items())
        + " (``num_threads``: min(envs, usable CPUs)); with 2 cores its ceiling is about 2x "
        "one Python-stepped vector env when both cores are free, and nothing when the other "
        "jobs on the machine keep them busy: its threads then queue for the same cores.",
        markdown_table(["envs", "env only: gymnasium steps/s", "env only: EnvPool steps/s",
                        "EnvPool / gymnasium", "fragment: gymnasium steps/s",
                        "fragment: EnvPool steps/s", "EnvPool / gymnasium",
                        f"batch MiB ({record['steps']} steps, uint8)",
                        "batch MiB if float32"], rows),
    ]
    if record.get("e2e"):
        e2e = record["e2e"]
        names = {"daskrl": "daskrl (gymnasium envs)",
                 "daskrl-1-thread": "daskrl, update on one thread (`actors-learner:threads=1`)",
                 "daskrl-envpool": "daskrl (EnvPool)", "sb3": "SB3 CnnPolicy, one torch thread",
                 "sb3-all-threads": "SB3 CnnPolicy, torch's default threads (every core)"}
        systems = [s for s in names if any(r["system"] == s for r in e2e)]
        med = {s: median(r["frames_per_s"] for r in e2e if r["system"] == s) for s in systems}
        part = {(s, k): median(r["per_iteration_s"].get(k) for r in e2e if r["system"] == s)
                for s in systems for k in ("env_s", "inference_s", "learn_s", "total")}
        first = next(r for r in e2e if r["system"] == systems[0])
        parts += [
            f"End to end: {first['steady_env_steps']:,} env steps "
            f"({FRAME_SKIP * first['steady_env_steps']:,} frames) timed per run after a "
            "warm-up iteration; medians over runs; seconds per iteration (8 envs x 128 steps) "
            "by part: *env* inside the vector env's step, *inference* daskrl: its actors' "
            "``inference_s`` (the CNN choosing actions); SB3: the rest of the rollout (the CNN, "
            "buffers, GAE), *update* 4 epochs x 4 minibatches of 256; *iteration* from one "
            "iteration's end to the next.",
            markdown_table(["system", "frames/s", "/ SB3 (one thread)", "/ SB3 (every core)",
                            "env s", "inference s", "update s", "iteration s"],
                           [[names[s], med[s], ratio(med[s], med.get("sb3")),
                             ratio(med[s], med.get("sb3-all-threads")),
                             part[s, "env_s"], part[s, "inference_s"], part[s, "learn_s"],
                             part[s, "total"]] for s in systems]),
        ]
    if record.get("note"):
        parts.append(record["note"])
    parts.append("Raw numbers: [`results/atari_speed.json`](results/atari_speed.json).")
    update_section(ROOT / "benchmarks/atari_speed.md", "atari_speed", "\n\n".join(parts))


if __name__ == "__main__":
    main()
