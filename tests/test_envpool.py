"""EnvPool backend: the same rollouts, metrics and flags as gymnasium's vector envs, with
EnvPool's C++ envs stepping; an id EnvPool lacks is refused in one line."""

from __future__ import annotations

import numpy as np
import pytest

from daskrl.algos.actor_critic import VecEnvActor
from daskrl.core.envs import make_vector_env

pytestmark = pytest.mark.timeout(120)

envpool = pytest.importorskip("envpool")


def test_envpool_classic_control_steps_like_gymnasium():
    """CartPole's dynamics are the same in both: from the same state, the same actions give the
    same next observations and rewards."""
    pool = make_vector_env("CartPole-v1", 4, seed=0, backend="envpool")
    gym_env = make_vector_env("CartPole-v1", 4, seed=0)
    obs, _ = pool.reset()
    gym_env.reset(seed=0)
    gym_env.unwrapped.state = obs.astype(np.float64).T.copy()  # numpy CartPole: (4, envs)
    actions = np.array([0, 1, 1, 0])
    pool_obs, pool_rew, *_ = pool.step(actions)
    gym_obs, gym_rew, *_ = gym_env.step(actions)
    np.testing.assert_allclose(pool_obs, gym_obs, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(pool_rew, gym_rew)


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_an_envpool_actor_collects_full_rollouts_with_episode_metrics(env_id):
    actor = VecEnvActor(env_id, 4, seed=1, hidden=(16,), backend="envpool")
    returns = []
    for _ in range(3):
        batch = actor.rollout(100)
        assert batch["stats"]["env_steps"] >= 400
        assert len(batch["obs"]) == batch["stats"]["env_steps"]
        returns += batch["stats"]["episode_returns"]
    assert returns, "episodes of 200 steps or fewer end within 300 steps"
    if env_id == "CartPole-v1":  # +1 per step: a return is its episode's length
        assert all(r == int(r) and 1 <= r <= 500 for r in returns)
    else:  # Pendulum's episodes are truncated at 200 steps, rewards in [-16.3, 0]
        assert all(-16.3 * 200 <= r <= 0 for r in returns)


def test_an_id_envpool_lacks_is_refused_in_one_line():
    with pytest.raises(ValueError) as err:
        make_vector_env("Taxi-v4", 2, seed=0, backend="envpool")
    assert str(err.value).startswith("env 'Taxi-v4' is not in EnvPool")
    assert "--env-backend gymnasium" in str(err.value) and "\n" not in str(err.value)


def test_ppo_trains_through_the_envpool_backend(cluster_tiny_ppo, tmp_path):
    from distributed import Client

    from daskrl.cluster.local import local_cluster
    from daskrl.distributions import get_distribution
    from daskrl.runtime.driver import RunSettings, train

    algo = cluster_tiny_ppo(env="CartPole-v1", env_backend="envpool", hidden=16)
    with local_cluster([{"CPU": 1}]) as cluster, Client(cluster) as client:
        summary = train(client, algo, get_distribution("actors-learner"),
                        RunSettings(out=tmp_path, steps=2 * algo.steps_per_iteration, seed=0,
                                    eval=True, progress=False, tensorboard=False))
    assert summary["env_steps"] >= 2 * algo.steps_per_iteration
    assert summary["eval_return_mean"] >= 1
