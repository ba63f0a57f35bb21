"""The learning suite's rows: each algorithm x env, its budget, daskrl's flags and the peer's
settings, and where a row's runs live."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PPO_VF_SB3 = 0.25
"""SB3's ``vf_coef`` for daskrl's 0.5 (SB3's value loss is twice daskrl's)."""

PPO_SB3 = {"n_steps": 128, "batch_size": 256, "n_epochs": 4, "learning_rate": 2.5e-4,
           "gamma": 0.99, "gae_lambda": 0.95, "clip_range": 0.2, "clip_range_vf": 0.2,
           "ent_coef": 0.01, "vf_coef": PPO_VF_SB3, "max_grad_norm": 0.5,
           "policy_kwargs": {"net_arch": {"pi": [64, 64], "vf": [64, 64]},
                             "activation": "tanh"}}
"""graphs/ppo.py's defaults in SB3's words: 8 envs x 128 steps, 4 minibatches of 256, separate
64x64 tanh actor and critic. daskrl's value loss is half the squared error (CleanRL's), SB3's
the whole: SB3's ``vf_coef`` is half daskrl's for the same weight. daskrl clips the value loss
as CleanRL does (the larger of the clipped and unclipped errors); SB3's ``clip_range_vf`` only
clips the prediction: the nearest SB3 has, not the same."""


PPO_MUJOCO_FLAGS = ("--num-envs", "1", "--num-steps", "2048", "--minibatch-size", "64",
                    "--update-epochs", "10", "--learning-rate", "3e-4", "--gamma", "0.99",
                    "--gae-lambda", "0.95", "--clip-coef", "0.2", "--ent-coef", "0.0",
                    "--vf-coef", "0.5", "--max-grad-norm", "0.5", "--hidden", "64",
                    "--normalize", "on", "--no-clip-vloss")
"""CleanRL's ``ppo_continuous_action`` settings as ``graphs/ppo.py`` flags (the MuJoCo rows)."""

PPO_MUJOCO_SB3 = {"n_steps": 2048, "batch_size": 64, "n_epochs": 10, "learning_rate": 3e-4,
                  "gamma": 0.99, "gae_lambda": 0.95, "clip_range": 0.2, "ent_coef": 0.0,
                  "vf_coef": PPO_VF_SB3, "max_grad_norm": 0.5,
                  "policy_kwargs": {"net_arch": {"pi": [64, 64], "vf": [64, 64]},
                                    "activation": "tanh"}}
"""The same settings in SB3's words."""


@dataclass(frozen=True)
class Row:
    """One algorithm x env of the suite and the peer it is measured beside."""

    name: str
    algo: str
    env: str
    steps: int
    graph: str
    flags: tuple[str, ...] = ()
    peer: str = "SB3"
    sb3: dict[str, Any] = field(default_factory=dict)
    """The SB3 child's spec (without env, steps and seed); empty when the peer is daskrl."""
    peer_flags: tuple[str, ...] = ()
    """The peer's ``daskrl train`` flags, when the peer is another daskrl run."""
    peer_row: str = ""
    """Another row whose peer runs this one shares (same env and budget)."""
    note: str = ""


ROWS: dict[str, Row] = {r.name: r for r in (
    Row("ppo-cartpole", "PPO", "CartPole-v1", 500_000, "graphs/ppo.py",
        sb3={"algo": "PPO", "n_envs": 8, "anneal_lr": True, "kwargs": PPO_SB3},
        note="graphs/ppo.py's defaults (CleanRL's), the README's budget"),
    Row("dqn-cartpole", "DQN", "CartPole-v1", 100_000, "graphs/dqn.py", ("--no-double-q",),
        sb3={"algo": "DQN", "n_envs": 4, "anneal_lr": True, "kwargs": {
            "learning_rate": 2.3e-3, "batch_size": 64, "buffer_size": 100_000,
            "learning_starts": 1000, "gamma": 0.99, "target_update_interval": 10,
            "train_freq": 64, "gradient_steps": 128, "exploration_fraction": 0.16,
            "exploration_final_eps": 0.04, "policy_kwargs": {"net_arch": [256, 256]}}},
        note="graphs/dqn.py's defaults (RL Zoo's, the rate annealed to 0) without double Q, "
             "which SB3 lacks; SB3's target update every 2 vector steps acts as once per "
             "256-step burst, as daskrl's"),
    Row("sac-pendulum", "SAC", "Pendulum-v1", 20_000, "graphs/sac.py",
        ("--env", "Pendulum-v1"),
        sb3={"algo": "SAC", "n_envs": 1, "kwargs": {"learning_rate": 1e-3, "train_freq": 200,
                                                    "gradient_steps": 200}},
        note="graphs/sac.py's defaults (RL Zoo's Pendulum settings, 1e-3 for every network); "
             "SB3 collects 200 steps and then takes 200 gradient steps, as a daskrl "
             "iteration does (SB3's default alternates one and one), with SB3's own "
             "log-std clamp and temperature loss"),
    Row("impala-cartpole", "IMPALA", "CartPole-v1", 500_000, "graphs/impala.py",
        peer="SB3 PPO", peer_row="ppo-cartpole",
        note="graphs/impala.py's defaults; neither SB3 nor CleanRL has IMPALA, so the peer is "
             "SB3's PPO on the same envs and budget (the ppo-cartpole row's runs)"),
    Row("dqn-mountaincar", "DQN", "MountainCar-v0", 120_000, "graphs/dqn.py",
        ("--env", "MountainCar-v0", "--num-envs", "1", "--num-steps", "16",
         "--train-frequency", "2", "--learning-rate", "4e-3", "--no-anneal-lr",
         "--batch-size", "128", "--buffer-size", "10000", "--learning-starts", "1000",
         "--gamma", "0.98", "--target-network-frequency", "600",
         "--exploration-fraction", "0.2", "--end-e", "0.07", "--no-double-q"),
        sb3={"algo": "DQN", "n_envs": 1, "kwargs": {
            "learning_rate": 4e-3, "batch_size": 128, "buffer_size": 10_000,
            "learning_starts": 1000, "gamma": 0.98, "target_update_interval": 600,
            "train_freq": 16, "gradient_steps": 8, "exploration_fraction": 0.2,
            "exploration_final_eps": 0.07, "policy_kwargs": {"net_arch": [256, 256]}}},
        note="RL Zoo's MountainCar-v0 settings in both"),
    Row("dqn-lunarlander", "DQN", "LunarLander-v3", 100_000, "graphs/dqn.py",
        ("--env", "LunarLander-v3", "--num-envs", "1", "--num-steps", "16",
         "--train-frequency", "1", "--learning-rate", "6.3e-4", "--no-anneal-lr",
         "--batch-size", "128", "--buffer-size", "50000", "--learning-starts", "0",
         "--target-network-frequency", "250", "--exploration-fraction", "0.12",
         "--end-e", "0.1", "--no-double-q"),
        sb3={"algo": "DQN", "n_envs": 1, "kwargs": {
            "learning_rate": 6.3e-4, "batch_size": 128, "buffer_size": 50_000,
            "learning_starts": 0, "gamma": 0.99, "target_update_interval": 250,
            "train_freq": 16, "gradient_steps": 16, "exploration_fraction": 0.12,
            "exploration_final_eps": 0.1, "policy_kwargs": {"net_arch": [256, 256]}}},
        note="RL Zoo's LunarLander settings, the gradient steps in bursts of 16 in both "
             "(Zoo: 4)"),
    Row("ppo-lunarlander", "PPO", "LunarLander-v3", 1_000_000, "graphs/ppo.py",
        ("--env", "LunarLander-v3", "--num-envs", "16", "--num-steps", "1024",
         "--minibatch-size", "64", "--update-epochs", "4", "--gamma", "0.999",
         "--gae-lambda", "0.98", "--learning-rate", "3e-4", "--no-anneal-lr",
         "--no-clip-vloss"),
        sb3={"algo": "PPO", "n_envs": 16, "kwargs": {
            "n_steps": 1024, "batch_size": 64, "n_epochs": 4, "learning_rate": 3e-4,
            "gamma": 0.999, "gae_lambda": 0.98, "ent_coef": 0.01, "vf_coef": PPO_VF_SB3,
            "policy_kwargs": {"net_arch": {"pi": [64, 64], "vf": [64, 64]},
                              "activation": "tanh"}}},
        note="RL Zoo's LunarLander settings in both"),
    *(Row(f"ppo-{name}", "PPO", env, 1_000_000, "graphs/ppo.py",
          ("--env", env, *PPO_MUJOCO_FLAGS),
          sb3={"algo": "PPO", "n_envs": 1, "anneal_lr": True, "normalize": True,
               "kwargs": PPO_MUJOCO_SB3},
          note="CleanRL's ppo_continuous_action settings in both (1 env, 2048-step rollouts, "
               "10 epochs of 64, the rate annealed) except value clipping, off as in SB3's "
               "default; observations normalised and rewards scaled by running statistics "
               "(SB3's VecNormalize); SB3 given the annealed rate and a vf_coef of 0.25")
      for name, env in (("halfcheetah", "HalfCheetah-v5"), ("walker2d", "Walker2d-v5"))),
    Row("sac-hopper", "SAC", "Hopper-v5", 100_000, "graphs/sac.py",
        ("--env", "Hopper-v5", "--learning-starts", "10000", "--policy-lr", "3e-4",
         "--q-lr", "3e-4"),
        sb3={"algo": "SAC", "n_envs": 1, "kwargs": {
            "learning_rate": 3e-4, "learning_starts": 10_000, "train_freq": 200,
            "gradient_steps": 200}},
        note="RL Zoo's Hopper settings (3e-4 for every network, 10k uniformly random steps "
             "first, 256x256 ReLU, batch 256, tau 0.005, the temperature tuned) at 100k steps, "
             "22-26 minutes a run here with two runs at once (SAC takes one gradient step "
             "per env step: 70-77 env-steps/s on this row); SB3 collects 200 steps, then "
             "takes 200 gradient steps, as a daskrl iteration does"),
    Row("mappo-spread", "MAPPO", "simple_spread", 320_000, "graphs/mappo.py",
        ("--env", "simple_spread"), peer="IPPO (daskrl)",
        peer_flags=("--env", "simple_spread", "--critic", "local"),
        note="graphs/mappo.py's defaults (the MAPPO paper's batch shape, 1.6 % of its 20M "
             "steps); SB3 has no multi-agent PPO and no published spread return could be "
             "retrieved (mpe_tasks.md), so the peer is the same graph with local critics"),
)}
"""The suite, in the order it runs. SAC on Hopper-v5 runs 100k steps, not the 1M where its
returns are usually quoted: at the 60-90 env-steps/s SAC and TD3 make here (one gradient step
per env step), 1M steps would take 3-4.5 hours a run."""

QUICK_STEPS = {"ppo-cartpole": 4096, "dqn-cartpole": 2048}


def source_row(row: Row, system: str) -> Row:
    """The row whose runs are ``row``'s for ``system``: a row sharing another's peer runs
    reads that row's.

    >>> source_row(ROWS["impala-cartpole"], "peer").name, source_row(ROWS["impala-cartpole"],
    ...                                                               "daskrl").name
    ('ppo-cartpole', 'impala-cartpole')
    """
    return ROWS[row.peer_row] if system == "peer" and row.peer_row else row


def run_dir(work: Path, row: Row, system: str, seed: int) -> Path:
    """The folder of one run.

    >>> run_dir(Path("w"), ROWS["ppo-cartpole"], "peer", 3).as_posix()
    'w/ppo-cartpole/peer-s3'
    """
    return work / source_row(row, system).name / f"{system}-s{seed}"
