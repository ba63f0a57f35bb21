"""Pixels: the Nature-DQN CNN head chosen from Atari's frame space, frames kept uint8 from the
env through a Dask transfer to the learner's update, and one-line refusals of spaces no head
serves and of an Atari id without ale-py."""

from __future__ import annotations

import sys

import gymnasium as gym
import numpy as np
import pytest
import torch
from dask.sizeof import sizeof
from distributed import Client, LocalCluster

from daskrl.algos.actor_critic import VecEnvActor
from daskrl.algos.categorical import CNNActorCritic
from daskrl.algos.layers import nature_cnn
from daskrl.algos.learner import ActorCriticLearner, batch_tensors
from daskrl.algos.networks import actor_critic_for
from daskrl.algos.ppo import PPOHyper
from daskrl.core.envs import check_env_id, env_spaces

pytestmark = pytest.mark.timeout(120)

GAME = "BreakoutNoFrameskip-v4"
FRAME_BYTES = 4 * 84 * 84


def _rollout(num_steps: int) -> dict:
    """A rollout of a CNN actor on 2 Breakout envs (run on a Dask worker below)."""
    return VecEnvActor(GAME, 2, seed=0).rollout(num_steps)


def test_atari_frames_stay_uint8_from_the_env_to_the_learner():
    pytest.importorskip("ale_py")
    obs_space, act_space = env_spaces(GAME)
    assert obs_space.shape == (4, 84, 84) and obs_space.dtype == np.uint8
    assert isinstance(actor_critic_for(obs_space, act_space), CNNActorCritic)
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                      dashboard_address=None) as cluster, Client(cluster) as client:
        batch = client.submit(_rollout, 8, pure=False).result()  # pickled across processes
    n = batch["stats"]["env_steps"]
    assert batch["obs"].dtype == np.uint8 and batch["obs"].shape == (n, 4, 84, 84)
    assert batch["obs"].nbytes == n * FRAME_BYTES
    # what Dask counts for the batch is about the uint8 frames, a quarter of float32 frames
    assert sizeof(batch) < 1.1 * n * FRAME_BYTES
    data = batch_tensors([batch], "cpu")
    assert data["obs"].dtype == torch.uint8
    learner = ActorCriticLearner(0, 0, seed=0, hp=PPOHyper(1, 1), network=lambda: (
        actor_critic_for(obs_space, act_space)))
    before = learner.weights()["actor.weight"].clone()
    metrics = learner.update([batch], 0.0)
    assert np.isfinite(metrics["losses/policy_loss"])
    assert not torch.equal(before, learner.weights()["actor.weight"])


def test_cnn_policy_scripts_and_matches_the_greedy_action():
    net = CNNActorCritic((4, 84, 84), 4)
    frames = torch.randint(0, 256, (3, 4, 84, 84), dtype=torch.uint8)
    pi = torch.jit.script(net.policy(deterministic=True))
    assert torch.equal(pi(frames), net.act(frames, deterministic=True)[0])
    # the torso scales bytes itself: the same frames as floats /255 give the same features
    torso = nature_cnn(4)
    torch.testing.assert_close(torso(frames), torso[1:](frames.float() / 255))


@pytest.mark.parametrize("obs_space, act_space, named", [
    (gym.spaces.Dict({"x": gym.spaces.Box(-1, 1, (3,))}), gym.spaces.Discrete(2),
     "observation space Dict"),
    (gym.spaces.Tuple((gym.spaces.Box(-1, 1, (3,)),)), gym.spaces.Discrete(2),
     "observation space Tuple"),
    (gym.spaces.Box(-1, 1, (3,)), gym.spaces.MultiDiscrete([2, 3]),
     "action space MultiDiscrete"),
    (gym.spaces.Box(-1, 1, (3,)), gym.spaces.Tuple((gym.spaces.Discrete(2),)),
     "action space Tuple"),
    (gym.spaces.Box(0, 255, (4, 84, 84), np.uint8), gym.spaces.Box(-1, 1, (2,)),
     "with image observations"),
])
def test_unserved_spaces_are_refused_in_one_line(obs_space, act_space, named):
    with pytest.raises(ValueError) as err:
        actor_critic_for(obs_space, act_space)
    message = str(err.value)
    assert named in message and "supported are" in message and "\n" not in message


class _MultiDiscreteEnv(gym.Env):
    observation_space = gym.spaces.Box(-1, 1, (3,))
    action_space = gym.spaces.MultiDiscrete([2, 3])

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(3, np.float32), {}

    def step(self, action):
        return np.zeros(3, np.float32), 0.0, True, False, {}


def test_the_ppo_graph_refuses_a_multidiscrete_env(cluster_ppo_graph):
    if "daskrl-test/MultiDiscrete-v0" not in gym.registry:
        gym.register("daskrl-test/MultiDiscrete-v0", entry_point=_MultiDiscreteEnv)
    config = cluster_ppo_graph.Config(env="daskrl-test/MultiDiscrete-v0")
    with pytest.raises(ValueError, match=r"^action space MultiDiscrete\(\[2 3\]\) is not served"):
        cluster_ppo_graph.build(config)


def test_an_atari_id_without_ale_py_names_the_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "ale_py", None)  # what an environment without it imports
    with pytest.raises(ValueError) as err:
        check_env_id("ALE/Pong-v5")
    assert str(err.value) == ("env 'ALE/Pong-v5' is an Atari game and ale-py is not installed: "
                              'pip install -e ".[atari]"  (ale-py and opencv-python-headless)')
