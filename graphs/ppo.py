"""PPO on gymnasium envs (CleanRL-equivalent maths), as fragments any distribution can place.

Run: ``daskrl train graphs/ppo.py --env CartPole-v1 --steps 500000``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

from daskrl import Algorithm, Resources, setting
from daskrl.algos.actor_critic import (
    ActorCriticLearner,
    VecEnvActor,
    evaluate_policy,
    policy_module,
)
from daskrl.algos.ppo import PPOHyper
from daskrl.core.envs import make_vector_env, space_dims
from daskrl.core.sizes import Sizes, mlp_params, transition_bytes


@dataclass
class Config:
    """PPO settings; each field is a ``--flag`` of ``daskrl train graphs/ppo.py``."""

    env: str = setting("gymnasium env id (discrete actions, flat observations)", "CartPole-v1")
    num_actors: int = setting("actor replicas (each with its own envs)", 1)
    num_envs: int = setting("envs per actor replica", 8)
    num_steps: int = setting("steps per env per rollout", 128)
    update_epochs: int = setting("passes over each batch", 4)
    num_minibatches: int = setting("minibatches per epoch", 4)
    minibatch_size: int = setting("minibatch size; overrides --num-minibatches when > 0", 0)
    learning_rate: float = setting("Adam learning rate", 2.5e-4)
    anneal_lr: bool = setting("anneal the learning rate linearly to 0", True)
    gamma: float = setting("discount factor", 0.99)
    gae_lambda: float = setting("GAE lambda", 0.95)
    clip_coef: float = setting("surrogate clipping coefficient", 0.2)
    clip_vloss: bool = setting("clip the value loss around the old values like the surrogate",
                               True)
    ent_coef: float = setting("entropy bonus coefficient", 0.01)
    vf_coef: float = setting("value loss coefficient", 0.5)
    max_grad_norm: float = setting("gradient-norm clip", 0.5)
    hidden: int = setting("hidden units in each of the two layers", 64)
    eval_episodes: int = setting("greedy episodes in the final evaluation", 10)
    compile: bool = setting("differentiate a torch.compile-d loss (inductor's on-disk cache, in "
                            "$TORCHINDUCTOR_CACHE_DIR, spares later runs the compile)", False)
    env_step_cost: float = setting("extra CPU seconds each env step burns (a stand-in for an "
                                   "expensive simulator)", 0.0)

    def hyper(self) -> PPOHyper:
        """The update settings, with ``--minibatch-size`` turned into a minibatch count."""
        batch = self.num_actors * self.num_envs * self.num_steps
        num_mb = max(1, batch // self.minibatch_size) if self.minibatch_size > 0 else (
            self.num_minibatches)
        return PPOHyper(
            update_epochs=self.update_epochs, num_minibatches=num_mb,
            learning_rate=self.learning_rate, anneal_lr=self.anneal_lr,
            clip_coef=self.clip_coef, clip_vloss=self.clip_vloss, ent_coef=self.ent_coef,
            vf_coef=self.vf_coef,
            max_grad_norm=self.max_grad_norm,
        )


def make_learner(config: Config, obs_dim: int, num_actions: int, seed: int, device: str
                 ) -> ActorCriticLearner:
    """Role ``learner``: the network and optimiser, on ``device``."""
    return ActorCriticLearner(obs_dim, num_actions, seed, (config.hidden,) * 2, config.hyper(),
                              device, compile=config.compile)


def make_actor(config: Config, seed: int) -> VecEnvActor:
    """Role ``rollout``: one replica's envs and policy copy."""
    return VecEnvActor(config.env, config.num_envs, seed, (config.hidden,) * 2, config.gamma,
                       config.gae_lambda, config.env_step_cost)


def evaluate(config: Config, weights: dict, seed: int) -> dict[str, float]:
    """Role ``evaluate``: greedy episodes on fresh envs."""
    return evaluate_policy(config.env, weights, seed, config.eval_episodes, (config.hidden,) * 2)


def build(config: Config) -> Algorithm:
    """PPO as an :class:`~daskrl.Algorithm`; the distribution decides where each role runs."""
    probe = make_vector_env(config.env, 1, seed=0)  # checks the env id and reads its spaces
    obs_dim, num_actions = space_dims(probe)
    probe.close()
    hidden = (config.hidden,) * 2  # DiscreteActorCritic: an actor and a critic MLP
    params = mlp_params(obs_dim, num_actions, hidden) + mlp_params(obs_dim, 1, hidden)
    return Algorithm(
        name="ppo",
        make_actor=partial(make_actor, config),
        make_learner=partial(make_learner, config, obs_dim, num_actions),
        evaluate=partial(evaluate, config),
        make_policy=partial(policy_module, config.env, (config.hidden,) * 2),
        num_steps=config.num_steps,
        num_envs=config.num_envs,
        num_actors=config.num_actors,
        resources={
            "rollout": Resources(cpu=1),
            "learner": Resources(gpu=1, fallback=Resources(cpu=1)),
            "evaluate": Resources(cpu=1),
        },
        env_id=config.env,
        sizes=Sizes(transition_bytes(obs_dim), params),  # for the memory check at launch
        capabilities={"gradients", "resizable-actor", "split-actor"},  # VecEnvActor, PPO
    )
