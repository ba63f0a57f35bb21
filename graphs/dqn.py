"""DQN on gymnasium envs with discrete actions: double Q, a target network (hard or Polyak),
n-step returns, an epsilon schedule and the Huber loss; CleanRL's flag names.

Run: ``daskrl train graphs/dqn.py --env CartPole-v1 --steps 50000`` (``single`` or
``actors-learner``: the replay lives with the learner), or
``daskrl train graphs/dqn.py --distribution apex --num-actors 4 --replay-shards 2`` (Ape-X:
replay shards on their own workers, prioritised, an epsilon per actor).
The defaults are RL Zoo's tuned CartPole-v1 settings for Stable-Baselines3's DQN, with the
learning rate annealed linearly to 0 over the run (``--anneal-lr``): at RL Zoo's constant
rate the policy reaches 500 within its 50k-step budget and then collapses in longer runs
(``benchmarks/dqn_budgets.md``), so a user who gave it more steps got a worse policy.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import numpy as np

from daskrl import Algorithm, Resources, setting
from daskrl.algos.dqn_learner import DQNHyper, DQNLearner
from daskrl.algos.env_runner import StepCost
from daskrl.algos.evaluation import evaluate_module
from daskrl.algos.q_actor import QActor
from daskrl.algos.qnet import discrete_dims, q_policy
from daskrl.algos.replay_buffers import PrioritizedReplay, transition_nbytes
from daskrl.core.sizes import Sizes, mlp_params


@dataclass
class Config:
    """DQN settings; each field is a ``--flag`` of ``daskrl train graphs/dqn.py``."""

    env: str = setting("gymnasium env id (discrete actions, flat observations)", "CartPole-v1")
    num_actors: int = setting("actor replicas (each with its own envs)", 1)
    num_envs: int = setting("envs per actor replica", 4)
    num_steps: int = setting("steps per env per rollout (an iteration)", 64)
    learning_rate: float = setting("Adam learning rate", 2.3e-3)
    anneal_lr: bool = setting("anneal the learning rate linearly to 0 over the run (with RL "
                              "Zoo's constant rate, CartPole's policy collapses past 100k "
                              "steps: the final policy then depends on the budget)", True)
    buffer_size: int = setting("replay capacity in transitions (all shards together)", 100_000)
    gamma: float = setting("discount factor", 0.99)
    tau: float = setting("target network update rate (1: hard copy; < 1: Polyak)", 1.0)
    target_network_frequency: int = setting(
        "env steps between target network updates (256: once per default iteration, as "
        "SB3's target_update_interval=10 with train_freq=256 acts: fixed over each burst of "
        "gradient steps)", 256)
    batch_size: int = setting("transitions per gradient step", 64)
    start_e: float = setting("initial exploration epsilon", 1.0)
    end_e: float = setting("final exploration epsilon", 0.04)
    exploration_fraction: float = setting("fraction of the run over which epsilon falls", 0.16)
    learning_starts: int = setting("transitions in the replay before learning starts (until "
                                   "then the learner waits)", 1000)
    train_frequency: int = setting("env steps per gradient step", 2)
    n_step: int = setting("env steps folded into each transition (n-step returns)", 1)
    double_q: bool = setting("double DQN: the online network picks the bootstrap action", True)
    prioritized_replay: bool = setting("proportional prioritised replay (always on under apex)",
                                       False)
    prioritized_replay_alpha: float = setting("priority exponent alpha", 0.6)
    prioritized_replay_beta: float = setting("initial importance-weight exponent beta "
                                             "(annealed to 1)", 0.4)
    max_grad_norm: float = setting("gradient-norm clip", 10.0)
    hidden: int = setting("hidden units in each of the two ReLU layers", 256)
    replay_shards: int = setting("replay shards under --distribution apex, each on a worker of "
                                 "its own holding --buffer-size / shards transitions", 1)
    save_replay: bool = setting("checkpoint the replay's contents (off: a resumed run starts "
                                "with an empty buffer)", True)
    eval_episodes: int = setting("greedy episodes in the final evaluation", 10)
    compile: bool = setting(
        "compile each whole gradient step (Q and its target, the loss, its gradients, the "
        "clip and the Adam step) with torch.compile: the first step compiles (seconds; "
        "inductor's on-disk cache in $TORCHINDUCTOR_CACHE_DIR spares later runs most of it)",
        False)
    env_step_cost: float = setting("extra CPU seconds each env step burns (a stand-in for an "
                                   "expensive simulator)", 0.0)
    env_step_sleep: float = setting("wall seconds each step of an actor's envs sleeps, using no "
                                    "CPU (a stand-in for simulators on other hosts)", 0.0)

    def hyper(self) -> DQNHyper:
        """The learner's settings."""
        return DQNHyper(
            learning_rate=self.learning_rate, anneal_lr=self.anneal_lr,
            batch_size=self.batch_size,
            buffer_size=self.buffer_size, learning_starts=self.learning_starts, tau=self.tau,
            target_network_frequency=self.target_network_frequency,
            train_frequency=self.train_frequency, start_e=self.start_e, end_e=self.end_e,
            exploration_fraction=self.exploration_fraction, double_q=self.double_q,
            prioritized_replay=self.prioritized_replay,
            prioritized_replay_alpha=self.prioritized_replay_alpha,
            prioritized_replay_beta=self.prioritized_replay_beta,
            max_grad_norm=self.max_grad_norm, save_replay=self.save_replay,
            compile=self.compile)


def make_learner(config: Config, obs_dim: int, num_actions: int, seed: int, device: str
                 ) -> DQNLearner:
    """Role ``learner``: Q-network, target, optimiser and the resident replay."""
    return DQNLearner(obs_dim, num_actions, seed, (config.hidden,) * 2, config.hyper(), device)


def make_actor(config: Config, seed: int) -> QActor:
    """Role ``rollout``: one replica's envs and epsilon-greedy Q-network copy."""
    return QActor(config.env, config.num_envs, seed, (config.hidden,) * 2, config.n_step,
                  config.gamma, step_cost=StepCost(config.env_step_cost, config.env_step_sleep))


def make_replay(config: Config, shard: int) -> PrioritizedReplay:
    """Role ``replay`` (apex): one prioritised shard, sampling for every gradient step of an
    iteration."""
    steps = config.num_actors * config.num_envs * config.num_steps
    rows = max(1, steps // max(1, config.train_frequency)) * config.batch_size
    capacity = -(-config.buffer_size // config.replay_shards)
    return PrioritizedReplay(capacity, config.prioritized_replay_alpha, seed=shard,
                             sample_rows=rows, save=config.save_replay)


def evaluate(config: Config, weights: dict, seed: int) -> dict[str, float]:
    """Role ``evaluate``: greedy episodes on fresh envs."""
    policy = q_policy(config.env, (config.hidden,) * 2, weights, deterministic=True)
    return evaluate_module(config.env, policy, seed, config.eval_episodes)


def build(config: Config) -> Algorithm:
    """DQN as an :class:`~daskrl.Algorithm`; the distribution decides where each role runs."""
    obs_dim, num_actions = discrete_dims(config.env)  # one line when the actions are not Discrete
    hidden = (config.hidden,) * 2
    per = transition_nbytes((obs_dim,), np.float32, (), np.int64, prioritized=True)
    return Algorithm(
        name="dqn",
        make_actor=partial(make_actor, config),
        make_learner=partial(make_learner, config, obs_dim, num_actions),
        evaluate=partial(evaluate, config),
        make_policy=partial(q_policy, config.env, hidden),
        make_replay=partial(make_replay, config),
        replay_shards=config.replay_shards,
        num_steps=config.num_steps,
        num_envs=config.num_envs,
        num_actors=config.num_actors,
        resources={
            "rollout": Resources(cpu=1),
            "learner": Resources(gpu=1, fallback=Resources(cpu=1)),
            "evaluate": Resources(cpu=1),
            "replay": Resources(cpu=1),
        },
        env_id=config.env,
        sizes=Sizes(per, 2 * mlp_params(obs_dim, num_actions, hidden),
                    replay_bytes=config.buffer_size * per),
        capabilities={"resizable-actor", "replay", "light-state"},
        distribution="single",
    )
