"""The learning suite's peer: one Stable-Baselines3 run, written like a daskrl run's folder.

Started by ``learning.py`` as ``python benchmarks/_learning_sb3.py SPEC.json OUT``, where the
spec names the algorithm, env, budget, seed and SB3's keyword arguments. ``OUT`` gets
``metrics.csv`` (``iteration``, ``env_steps``, ``episode_return_mean``: the mean return of the
episodes that ended since the row before, one row per about 1/200 of the run) and
``summary.json`` (``eval_return_mean`` over greedy episodes on the envs daskrl's final
evaluation of the same seed plays, the wall clock), the two files the suite reads from
daskrl's runs too, and ``model.zip``.
"""

from __future__ import annotations

import csv
import json
import sys
import time
from pathlib import Path
from typing import Any


def build(spec: dict[str, Any]) -> tuple[Any, Any]:
    """The SB3 model of ``spec`` and its (possibly normalised) vector env."""
    import torch
    from stable_baselines3 import DQN, PPO, SAC
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

    env = make_vec_env(spec["env"], n_envs=spec.get("n_envs", 1), seed=spec["seed"],
                       vec_env_cls=DummyVecEnv)
    if spec.get("normalize"):
        env = VecNormalize(env, gamma=spec["kwargs"].get("gamma", 0.99))
    kwargs = dict(spec["kwargs"])
    lr = kwargs.pop("learning_rate")
    # daskrl anneals linearly to 0 over the run; SB3 calls a schedule with the share of the
    # run remaining (1 -> 0): the same line
    # (a run ends up to one rollout past its budget: no negative rate there)
    kwargs["learning_rate"] = ((lambda remaining: lr * max(remaining, 0.0))
                               if spec.get("anneal_lr") else lr)
    policy_kwargs = dict(kwargs.pop("policy_kwargs", {}))
    if "activation" in policy_kwargs:
        name = policy_kwargs.pop("activation")
        policy_kwargs["activation_fn"] = {"tanh": torch.nn.Tanh, "relu": torch.nn.ReLU}[name]
    algo = {"PPO": PPO, "DQN": DQN, "SAC": SAC}[spec["algo"]]
    model = algo("MlpPolicy", env, seed=spec["seed"], device="cpu", verbose=0,
                 policy_kwargs=policy_kwargs, **kwargs)
    return model, env


def evaluate(model: Any, env: Any, spec: dict[str, Any]) -> float:
    """Mean return of greedy episodes on the very envs daskrl's final evaluation of a run with
    the same seed plays (``daskrl.algos.evaluation.evaluate_module``, seeded by
    ``evaluation_seed``), observations normalised with the training statistics frozen."""
    import torch
    from stable_baselines3.common.vec_env import VecNormalize

    from daskrl.algos.evaluation import evaluate_module
    from daskrl.core.roles import evaluation_seed

    def act(obs: torch.Tensor) -> torch.Tensor:
        seen = obs.numpy()
        if isinstance(env, VecNormalize):
            seen = env.normalize_obs(seen)
        return torch.as_tensor(model.predict(seen, deterministic=True)[0])

    return evaluate_module(spec["env"], act, evaluation_seed(spec["seed"]),
                           spec.get("eval_episodes", 10))["eval_return_mean"]


def main(spec_path: str, out_dir: str) -> None:
    """Train, write ``metrics.csv`` as it goes and ``summary.json`` at the end."""
    import torch
    from stable_baselines3.common.callbacks import BaseCallback

    torch.set_num_threads(1)  # as a daskrl task granted one CPU
    spec = json.loads(Path(spec_path).read_text())
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    every = max(1, spec["steps"] // 200)

    class Curve(BaseCallback):
        """One metrics row per ``every`` env steps with an episode in it."""

        def __init__(self, writer: Any) -> None:
            super().__init__()
            self.writer, self.returns, self.rows, self.last = writer, [], 0, 0

        def _on_step(self) -> bool:
            for info in self.locals["infos"]:
                if "episode" in info:
                    self.returns.append(float(info["episode"]["r"]))
            if self.returns and self.num_timesteps - self.last >= every:
                self.flush()
            return True

        def flush(self) -> None:
            self.rows += 1
            self.writer.writerow([self.rows, self.num_timesteps,
                                  sum(self.returns) / len(self.returns)])
            self.returns, self.last = [], self.num_timesteps

    t0 = time.perf_counter()
    model, env = build(spec)
    with (out / "metrics.csv").open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["iteration", "env_steps", "episode_return_mean"])
        curve = Curve(writer)
        t1 = time.perf_counter()
        model.learn(spec["steps"], callback=curve)
        train_s = time.perf_counter() - t1
        if curve.returns:
            curve.flush()
    model.save(out / "model.zip")  # to evaluate again without training again
    summary = {"eval_return_mean": evaluate(model, env, spec), "env_steps": model.num_timesteps,
               "train_s": train_s, "wall_s": time.perf_counter() - t0,
               "env_steps_per_s": model.num_timesteps / train_s, "spec": spec}
    (out / "summary.json").write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main(*sys.argv[1:3])
