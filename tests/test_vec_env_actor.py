"""VecEnvActor: rollouts that drop auto-reset steps, checked against a replay of the same
actions on a fresh vector env, and reproducible from the actor's seed."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from daskrl.algos.actor_critic import VecEnvActor
from daskrl.core.envs import make_vector_env

pytestmark = pytest.mark.timeout(60)


def replay(env_id, num_envs, seed, batches):
    """Re-run the actor's rollouts on a fresh vector env, taking actions from the batches.

    Returns per rollout: ``rows`` ((t, env) of each batch entry), the episode returns and
    lengths, and every step's ``(obs, reward, terminated, done, valid, next_obs)``.
    """
    env = make_vector_env(env_id, num_envs, seed)
    obs, _ = env.reset(seed=seed)
    prev_done = np.zeros(num_envs, bool)
    ep_ret, ep_len = np.zeros(num_envs), np.zeros(num_envs, int)
    expected = []
    for batch in batches:
        j, rows, returns, lengths, steps = 0, [], [], [], []
        for t in range(batch["stats"]["rollout_steps"]):
            valid = ~prev_done  # the step after an episode's end is a reset step
            actions = np.zeros(num_envs, np.int64)
            for i in np.flatnonzero(valid):
                actions[i] = batch["actions"][j]
                rows.append((t, i))
                j += 1
            before = obs
            obs, rew, term, trunc, _ = env.step(actions)
            done = term | trunc
            ep_ret += rew * valid
            ep_len += valid
            for i in np.flatnonzero(done & valid):
                returns.append(ep_ret[i])
                lengths.append(int(ep_len[i]))
                ep_ret[i], ep_len[i] = 0, 0
            steps.append((before, rew, term, done, valid, obs))
            prev_done = done
        assert j == len(batch["actions"])
        expected.append((rows, returns, lengths, steps))
    env.close()
    return expected


def expected_advantages(steps, net, gamma, lam):
    """GAE written per env from the replayed steps (independent of the actor's buffers)."""
    value = lambda o: net.value(torch.as_tensor(o, dtype=torch.float32)).detach().numpy()  # noqa: E731
    T, N = len(steps), len(steps[0][1])
    adv = np.zeros((T, N))
    for i in range(N):
        acc = 0.0
        for t in reversed(range(T)):
            before, rew, term, done, valid, after = steps[t]
            v, v_next = value(before[i:i + 1])[0], value(after[i:i + 1])[0]
            delta = rew[i] + gamma * v_next * (not term[i]) - v
            acc = delta + (0.0 if done[i] else gamma * lam * acc)
            adv[t, i] = acc
    return adv


@pytest.mark.parametrize("env_id, limit", [("CartPole-v1", None), ("daskrl-test/Short-v0", 8)])
def test_vec_env_actor_drops_reset_steps_and_matches_a_replay(env_id, limit):
    if limit and env_id not in gym.registry:
        gym.register(env_id, entry_point="gymnasium.envs.classic_control.cartpole:CartPoleEnv",
                     max_episode_steps=limit)
    num_envs, seed, gamma, lam = 4, 123, 0.97, 0.9
    actor = VecEnvActor(env_id, num_envs, seed, (16, 16), gamma, lam)
    batches = []
    # rollouts continue episodes across their boundaries; the third reuses the first's buffers
    for num_steps in (37, 50, 37, 23):
        batch = actor.rollout(num_steps)
        batch["num_steps"] = num_steps
        batches.append(batch)
    expected = replay(env_id, num_envs, seed, batches)
    resets = 0
    for batch, (rows, returns, lengths, steps) in zip(batches, expected, strict=True):
        stats = batch["stats"]
        n = stats["env_steps"]
        assert len(steps) == stats["rollout_steps"] >= batch["num_steps"]
        # one entry per real transition: reset steps are not in the batch ...
        assert n == len(rows) == sum(int(s[4].sum()) for s in steps)
        # ... and the envs stepped on until there were num_steps per env, and no longer
        target = batch["num_steps"] * num_envs
        assert n >= target
        assert (len(steps) == batch["num_steps"]
                or sum(int(s[4].sum()) for s in steps[:-1]) < target)
        assert stats["env_s"] > 0 and stats["inference_s"] > 0
        assert all(len(batch[k]) == n for k in ("obs", "actions", "logp", "values",
                                                "advantages", "returns"))
        resets += len(steps) * num_envs - n
        np.testing.assert_array_equal(batch["obs"], np.stack([steps[t][0][i] for t, i in rows]))
        assert stats["episode_lengths"] == lengths and len(lengths) > 0
        assert stats["episode_returns"] == pytest.approx(returns)
        assert stats["episode_returns"] == pytest.approx(lengths)  # CartPole: reward 1 per step
        if limit:
            assert max(lengths) <= limit and limit in lengths  # some episodes were truncated
        adv = expected_advantages(steps, actor.net, gamma, lam)
        np.testing.assert_allclose(batch["advantages"], [adv[t, i] for t, i in rows],
                                   rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(batch["returns"], batch["advantages"] + batch["values"],
                                   rtol=1e-5, atol=1e-5)
    assert resets > 0
    actor.close()


def test_vec_env_actor_is_reproducible_from_its_seed():
    a, b = (VecEnvActor("CartPole-v1", 2, seed=7, hidden=(8, 8)) for _ in range(2))
    b.set_weights(a.net.state_dict(), version=0)
    a.set_weights(a.net.state_dict(), version=0)
    ba, bb = a.rollout(30), b.rollout(30)
    for key in ("obs", "actions", "advantages"):
        np.testing.assert_array_equal(ba[key], bb[key])
    assert ba["stats"]["policy_version"] == 0


def test_rollout_log_probs_and_values_are_the_networks():
    """Inference runs the same network the learner differentiates: the batch's log-probs and
    values equal ``net.evaluate`` on its observations and actions; a seed repeats it."""
    a, b = (VecEnvActor("CartPole-v1", num_envs=4, seed=3) for _ in range(2))
    b.set_weights(a.net.state_dict(), version=0)
    first, again = a.rollout(16), b.rollout(16)
    for key in ("obs", "actions", "logp", "values"):
        np.testing.assert_array_equal(first[key], again[key])
    with torch.no_grad():
        logp, _, values = a.net.evaluate(torch.from_numpy(first["obs"]),
                                         torch.from_numpy(first["actions"]))
    np.testing.assert_allclose(first["logp"], logp.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(first["values"], values.numpy(), rtol=1e-5, atol=1e-6)
    assert len(set(first["actions"].tolist())) == 2  # sampled, not greedy


def test_gaussian_actor_clips_actions_and_scales_rewards_by_the_return_statistics():
    """A Pendulum actor with reward scaling: the envs get the sampled actions clipped to
    [-2, 2]; GAE runs on rewards divided by the std of the running return statistics it was
    sent; the batch's return moments are those of each env's discounted return (a replay on a
    fresh env gives the rewards)."""
    from daskrl.algos.gae import gae
    from daskrl.algos.normalize import Moments, Normalization

    num_envs, steps, gamma, lam = 2, 30, 0.9, 0.8
    actor = VecEnvActor("Pendulum-v1", num_envs, seed=5, hidden=(8,), gamma=gamma,
                        gae_lambda=lam, normalization=Normalization(obs=True, reward=True))
    weights = actor.net.state_dict()
    weights["ret_rms.var"] = torch.tensor(4.0, dtype=torch.float64)  # rewards halved
    weights["actor_logstd"] = torch.full((1, 1), 1.0)  # wide: some samples exceed the bounds
    actor.set_weights(weights, 0)
    batch = actor.rollout(steps)  # 30 < 200 steps: no episode ends, every step is valid
    assert batch["stats"]["env_steps"] == steps * num_envs
    actions = batch["actions"].reshape(steps, num_envs, 1)
    assert np.abs(actions).max() > 2
    env = make_vector_env("Pendulum-v1", num_envs, seed=5)
    env.reset(seed=5)
    rewards = np.stack([env.step(np.clip(a, -2, 2))[1] for a in actions])
    discounted = np.zeros_like(rewards)
    acc = np.zeros(num_envs)
    for t in range(steps):
        acc = acc * gamma + rewards[t]
        discounted[t] = acc
    got = batch["moments"]["ret"]
    want = Moments.of(discounted.reshape(-1))
    assert got.count == want.count
    np.testing.assert_allclose([got.mean, got.m2], [want.mean, want.m2], rtol=1e-9)
    values = batch["values"].reshape(steps, num_envs)
    with torch.no_grad():
        last = actor.net.value(torch.as_tensor(actor.runner.obs)).numpy()
    no = np.zeros((steps, num_envs), bool)
    adv, _ = gae(rewards / np.sqrt(4.0 + 1e-8), values, np.concatenate([values[1:], last[None]]),
                 no, no, gamma, lam)
    np.testing.assert_allclose(batch["advantages"], adv.reshape(-1), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("env_id", ["Pendulum-v1", "daskrl-test/Short-v0"])
def test_vector_env_without_infos_steps_as_gymnasium_does(env_id):
    """The actors' info-less vector env returns gymnasium's SyncVectorEnv results bit for bit,
    across next-step auto-resets (Pendulum truncates at 200 steps, Short-v0 ends early)."""
    if env_id.startswith("daskrl-test") and env_id not in gym.registry:
        gym.register(env_id, entry_point="gymnasium.envs.classic_control.cartpole:CartPoleEnv",
                     max_episode_steps=8)
    ours = make_vector_env(env_id, 3, seed=4, infos=False)
    theirs = make_vector_env(env_id, 3, seed=4)
    assert type(ours) is not type(theirs)
    np.testing.assert_array_equal(ours.reset(seed=4)[0], theirs.reset(seed=4)[0])
    rng = np.random.default_rng(0)
    space = theirs.single_action_space
    resets = 0
    for _ in range(450):
        if isinstance(space, gym.spaces.Box):
            actions = rng.uniform(space.low, space.high, (3, *space.shape)).astype(space.dtype)
        else:
            actions = rng.integers(space.n, size=3)
        got, want = ours.step(actions), theirs.step(actions)
        assert got[4] == {}
        for a, b in zip(got[:4], want[:4], strict=True):
            assert a.dtype == b.dtype
            np.testing.assert_array_equal(a, b)
        resets += int((want[2] | want[3]).sum())
    assert resets >= 3
