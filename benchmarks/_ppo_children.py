"""PPO CartPole benchmark: the child processes that run SB3, the lean loop and the hand
kernel (started through ``ppo_cartpole.py --child``, which writes their trace as JSON)."""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from _ppo_setup import ENV_ID, Hyper

# ----------------------------------------------------------------------------------------
# child processes: SB3 and the lean loop


def _iteration_record(t_end: float, env_steps: int, returns: list[float]) -> dict[str, Any]:
    return {"t_end": t_end, "env_steps": int(env_steps), "episodes": len(returns),
            "return_mean": float(sum(returns) / len(returns)) if returns else None}


def child_sb3(steps: int, seed: int, hp: Hyper, evaluate: bool, graph: Path
              ) -> dict[str, Any]:
    """Stable-Baselines3 PPO, DummyVecEnv of ``num_envs`` Monitor-wrapped envs, on the CPU.

    ``graph`` is unused (SB3 has no graph script); it keeps the child signatures alike.
    """
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.evaluation import evaluate_policy
    from stable_baselines3.common.vec_env import DummyVecEnv
    from torch import nn

    class Recorder(BaseCallback):
        """Notes each iteration's end time, env steps and Monitor episode returns."""

        def __init__(self) -> None:
            super().__init__()
            self.t_train_start = 0.0
            self.iterations: list[dict[str, Any]] = []
            self.returns: list[float] = []
            self.pending: tuple[int, list[float]] | None = None

        def _close(self) -> None:
            if self.pending is not None:
                self.iterations.append(_iteration_record(time.time(), *self.pending))
                self.pending = None

        def _on_training_start(self) -> None:
            self.t_train_start = time.time()

        def _on_rollout_start(self) -> None:
            self._close()  # the previous iteration's update has just finished

        def _on_step(self) -> bool:
            for info in self.locals["infos"]:
                if "episode" in info:
                    self.returns.append(float(info["episode"]["r"]))
            return True

        def _on_rollout_end(self) -> None:
            self.pending = (self.num_timesteps, self.returns)
            self.returns = []

        def _on_training_end(self) -> None:
            self._close()

    lr = hp.learning_rate
    env = make_vec_env(ENV_ID, n_envs=hp.num_envs, seed=seed, vec_env_cls=DummyVecEnv)
    model = PPO(
        "MlpPolicy", env, learning_rate=(lambda p: lr * p) if hp.anneal_lr else lr,
        n_steps=hp.num_steps, batch_size=hp.minibatch_size, n_epochs=hp.update_epochs,
        gamma=hp.gamma, gae_lambda=hp.gae_lambda, clip_range=hp.clip_coef,
        # SB3 clips the predicted value itself, not CleanRL's max of two losses
        clip_range_vf=hp.clip_coef if hp.clip_vloss else None,
        ent_coef=hp.ent_coef, vf_coef=hp.vf_coef, max_grad_norm=hp.max_grad_norm,
        policy_kwargs={"net_arch": {"pi": [hp.hidden] * 2, "vf": [hp.hidden] * 2},
                       "activation_fn": nn.Tanh},
        device="cpu", seed=seed, verbose=0,
    )
    recorder = Recorder()
    model.learn(total_timesteps=steps, callback=recorder)
    result: dict[str, Any] = {"t_train_start": recorder.t_train_start,
                              "iterations": recorder.iterations}
    if evaluate:
        eval_env = make_vec_env(ENV_ID, n_envs=hp.eval_episodes, seed=seed + 10_000,
                                vec_env_cls=DummyVecEnv)
        mean, _ = evaluate_policy(model, eval_env, n_eval_episodes=hp.eval_episodes,
                                  deterministic=True)
        result["eval_return_mean"] = float(mean)
    return result


def child_hand(steps: int, seed: int, hp: Hyper, evaluate: bool, graph: Path
               ) -> dict[str, Any]:
    """The reference limit: :mod:`hand_kernel`'s numpy inference, hand-derived gradients and
    numpy Adam, in the loop of :func:`child_lean` (the same envs, buffers and GAE)."""
    return child_lean(steps, seed, hp, evaluate, graph, hand=True)


def child_lean(steps: int, seed: int, hp: Hyper, evaluate: bool, graph: Path,
               hand: bool = False) -> dict[str, Any]:
    """daskrl's own PPO roles (from ``graphs/ppo.py``) called in a plain loop, no Dask.

    The same actor, learner and evaluation objects the Dask tasks use, so the gap to
    daskrl is what the task graph costs. ``hand``: the policy copy and the learner are
    :mod:`hand_kernel`'s instead (the gap to it is what autograd and torch.optim cost).
    """
    import daskrl
    from daskrl.core.script import load_graph

    module = load_graph(str(graph))
    names = {f for f in module.Config.__dataclass_fields__}
    config = module.Config(**{k: v for k, v in asdict(hp).items() if k in names}, env=ENV_ID)
    algo = module.build(config)
    num_iterations = max(1, math.ceil(steps / algo.steps_per_iteration))
    actor = algo.make_actor(seed)
    learner = algo.make_learner(seed + 1, "cpu")
    if hand:
        from hand_kernel import HandLearner, hand_actor

        actor = hand_actor(actor)
        learner = HandLearner(learner.net.actor[0].in_features, learner.net.actor[-1].out_features,
                              seed + 1, (hp.hidden,) * 2, learner.hp)
    iterations: list[dict[str, Any]] = []
    env_steps = 0
    t_train_start = time.time()
    for k in range(num_iterations):
        actor.set_weights(learner.weights(), k)
        batch = actor.rollout(algo.num_steps)
        learner.update([batch], k / num_iterations)
        env_steps += batch["stats"]["env_steps"]
        iterations.append(_iteration_record(time.time(), env_steps,
                                            list(batch["stats"]["episode_returns"])))
    result: dict[str, Any] = {"t_train_start": t_train_start, "iterations": iterations,
                              "daskrl_file": daskrl.__file__}
    if evaluate:
        result["eval_return_mean"] = float(
            algo.evaluate(learner.weights(), seed + 10_000)["eval_return_mean"])
    return result


def child_main(args: argparse.Namespace) -> int:
    """Hidden child mode: run one system and write its trace as JSON."""
    import torch

    torch.set_num_threads(args.torch_threads)
    hp = Hyper(**json.loads(args.child_hyper)) if args.child_hyper else Hyper()
    fn = {"sb3": child_sb3, "lean": child_lean, "hand": child_hand}[args.child]
    result = fn(args.steps, args.seed, hp, args.child_eval, Path(args.child_graph))
    result["extra"] = {"torch_threads": torch.get_num_threads()}
    if "daskrl_file" in result:
        result["extra"]["daskrl_file"] = result.pop("daskrl_file")
    Path(args.child_out).write_text(json.dumps(result))
    return 0
