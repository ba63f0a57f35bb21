"""CPU seconds per PPO iteration by part, daskrl's roles against Stable-Baselines3's, with the
same settings (``python benchmarks/mujoco_ppo.py --cpu``).

On a shared machine wall-clock speed follows the load more than the code; the CPU time a
thread spends on each part of an iteration follows it much less. Each child process runs
one system: daskrl's actor and learner (the objects its tasks run, from ``graphs/ppo.py``, in a
plain loop: no Dask) or SB3's ``collect_rollouts`` and ``train``, and reports the thread CPU
seconds of every iteration's rollout and update (after a warm-up iteration). The
parent alternates the systems.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

CHILD = r'''
import json, sys, time
import torch
torch.set_num_threads(1)
system, env_id, iters, s = sys.argv[1], sys.argv[2], int(sys.argv[3]), json.loads(sys.argv[4])
out = []
if system == "daskrl":
    from daskrl.core.script import load_graph
    m = load_graph(sys.argv[5])
    algo = m.build(m.Config(env=env_id, num_envs=s["num_envs"], num_steps=s["num_steps"],
                            update_epochs=s["update_epochs"], minibatch_size=s["minibatch_size"],
                            learning_rate=s["learning_rate"], gamma=s["gamma"],
                            gae_lambda=s["gae_lambda"], clip_coef=s["clip_coef"],
                            clip_vloss=s["clip_vloss"], ent_coef=s["ent_coef"],
                            vf_coef=s["vf_coef"], max_grad_norm=s["max_grad_norm"],
                            hidden=s["hidden"]))
    actor, learner = algo.make_actor(0), algo.make_learner(1, "cpu")
    for k in range(iters + 1):
        c0 = time.thread_time()
        actor.set_weights(learner.weights(), k)
        batch = actor.rollout(s["num_steps"])
        c1 = time.thread_time()
        learner.update([batch], k / (iters + 1))
        c2 = time.thread_time()
        out.append({"rollout": c1 - c0, "update": c2 - c1, "steps": batch["stats"]["env_steps"]})
else:
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize
    env = VecNormalize(make_vec_env(env_id, n_envs=s["num_envs"], seed=0), gamma=s["gamma"])
    lr = s["learning_rate"]
    model = PPO("MlpPolicy", env, n_steps=s["num_steps"], batch_size=s["minibatch_size"],
                n_epochs=s["update_epochs"], learning_rate=lambda p: lr * p, gamma=s["gamma"],
                gae_lambda=s["gae_lambda"], clip_range=s["clip_coef"], ent_coef=s["ent_coef"],
                clip_range_vf=s["clip_coef"] if s["clip_vloss"] else None,
                vf_coef=s["vf_coef"], max_grad_norm=s["max_grad_norm"], seed=0, device="cpu",
                policy_kwargs={"net_arch": {"pi": [s["hidden"]] * 2, "vf": [s["hidden"]] * 2},
                               "activation_fn": torch.nn.Tanh, "log_std_init": 0.0})
    collect, train = model.collect_rollouts, model.train
    def timed_collect(*a, **k):
        c = time.thread_time(); r = collect(*a, **k)
        out.append({"rollout": time.thread_time() - c, "steps": s["num_steps"] * s["num_envs"]})
        return r
    def timed_train(*a, **k):
        c = time.thread_time(); r = train(*a, **k); out[-1]["update"] = time.thread_time() - c
        return r
    model.collect_rollouts, model.train = timed_collect, timed_train
    model.learn(s["num_steps"] * s["num_envs"] * (iters + 1))
print("RESULT " + json.dumps(out[1:]))
'''


def run_cpu(system: str, env_id: str, iterations: int, settings: dict[str, Any], root: Path,
            env: dict[str, str], timeout: float) -> dict[str, Any]:
    """One child: ``system``'s per-iteration thread CPU seconds (rollout, update), medians."""
    from _common import median

    load = __import__("os").getloadavg()[0]
    t0 = time.time()
    proc = subprocess.run([sys.executable, "-c", CHILD, system, env_id, str(iterations),
                           json.dumps(settings), str(root / "graphs/ppo.py")], cwd=root,
                          env=env, capture_output=True, text=True, timeout=timeout)
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode or not line:
        raise RuntimeError(f"{system} CPU run failed: {proc.stderr[-2000:]}")
    its = json.loads(line[0][7:])
    rollout = median(it["rollout"] for it in its)
    update = median(it["update"] for it in its)
    assert rollout is not None and update is not None
    return {"system": system, "env": env_id, "load_1min_before": load,
            "wall_s": time.time() - t0, "iterations": its, "rollout_cpu_s": rollout,
            "update_cpu_s": update, "iteration_cpu_s": rollout + update,
            "env_steps_per_cpu_s": median(it["steps"] for it in its) / (rollout + update)}
