"""Continuous actions: the Gaussian head against torch.distributions, running statistics merged
by the learner equal to those of the concatenated data (also through a data-parallel average),
the statistics travelling with weights, checkpoints and the exported policy, bit-identical
weights on one and two workers, and MuJoCo envs under every distribution that serves PPO."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from distributed import Client

from daskrl.algos.actor_critic import VecEnvActor, policy_module
from daskrl.algos.gaussian import GaussianActorCritic
from daskrl.algos.learner import ActorCriticLearner
from daskrl.algos.networks import actor_critic_for
from daskrl.algos.normalize import (
    EPS,
    Moments,
    Normalization,
    RunningMeanStd,
    from_shifted_sums,
    merge_all,
    shifted_sums,
)
from daskrl.algos.ppo import PPOHyper
from daskrl.core.envs import env_spaces
from daskrl.distributions import get_distribution
from daskrl.runtime.driver import RunSettings, train

pytestmark = pytest.mark.timeout(300)

NORM = Normalization(obs=True, reward=True)


def test_gaussian_logp_and_entropy_match_torch_normal():
    torch.manual_seed(0)
    net = GaussianActorCritic(5, 3, (16,))
    with torch.no_grad():
        net.actor_logstd.copy_(torch.tensor([[-0.5, 0.0, 0.7]]))
    obs, actions = torch.randn(64, 5), 2 * torch.randn(64, 3)
    logp, entropy, values = net.evaluate(obs, actions)
    dist = torch.distributions.Normal(net.actor_mean(obs), net.actor_logstd.exp())
    torch.testing.assert_close(logp, dist.log_prob(actions).sum(1))
    torch.testing.assert_close(entropy, dist.entropy().sum(1))
    torch.testing.assert_close(values, net.critic(obs).squeeze(-1))
    # acting samples from that distribution and reports the density of its sample
    a, lp, _ = net.act(obs, torch.Generator().manual_seed(1))
    torch.testing.assert_close(lp, dist.log_prob(a).sum(1))
    many = net.act(torch.zeros(20_000, 5), torch.Generator().manual_seed(2))[0]
    torch.testing.assert_close(many.std(0), net.actor_logstd.exp()[0], rtol=0.03, atol=0)


def test_merged_moments_equal_those_of_the_concatenated_data():
    rng = np.random.default_rng(0)
    parts = [rng.normal(3.0, 2.0, size=(n, 4)) * [1, 10, 0.1, 1] for n in (1, 7, 50, 13)]
    whole = np.concatenate(parts)
    merged = merge_all(Moments.of(p) for p in parts)
    np.testing.assert_allclose(merged.mean, whole.mean(0), rtol=1e-12)
    np.testing.assert_allclose(merged.var, whole.var(0), rtol=1e-12)
    assert merged.count == len(whole)
    # the data-parallel path: replicas average their shifted sums, the learner scales back
    center = rng.normal(size=4)
    avg = np.mean([shifted_sums(Moments.of(p), center) for p in parts], axis=0)
    back = from_shifted_sums(avg, center, scale=len(parts))
    np.testing.assert_allclose(back.mean, whole.mean(0), rtol=1e-10)
    np.testing.assert_allclose(back.var, whole.var(0), rtol=1e-10)
    # folded into running statistics (gymnasium's prior: mean 0, var 1, count 1e-4)
    rms = RunningMeanStd((4,))
    rms.update(merged)
    prior = Moments(1e-4, np.zeros(4), np.full(4, 1e-4))
    expect = prior.merge(Moments.of(whole))
    np.testing.assert_allclose(rms.var.numpy(), expect.var, rtol=1e-12)
    np.testing.assert_allclose(rms.mean.numpy(), expect.mean, rtol=1e-12)


def test_learner_merges_the_actors_statistics_into_the_weights():
    actors = [VecEnvActor("Pendulum-v1", 3, seed=s, hidden=(16,), normalization=NORM)
              for s in (1, 2)]
    spaces = env_spaces("Pendulum-v1")
    learner = ActorCriticLearner(0, 0, seed=0, hp=PPOHyper(1, 2), network=lambda: (
        actor_critic_for(*spaces, (16,), NORM)), replicas=2)
    seen_obs, batches = [], []
    for it in range(2):
        for a in actors:
            a.set_weights(learner.weights(), it)
        batches = [a.rollout(40) for a in actors]
        seen_obs += [b["obs"] for b in batches]
        # the actors normalise with the statistics they were sent, not their own rollout's
        assert all(torch.equal(a.net.obs_rms.mean, learner.net.obs_rms.mean) for a in actors)
        learner.update(batches, it / 2)
    whole = np.concatenate(seen_obs).astype(np.float64)
    weights = learner.weights()
    assert weights["obs_rms.count"].item() == pytest.approx(len(whole) + 1e-4)
    np.testing.assert_allclose(weights["obs_rms.mean"].numpy(), whole.mean(0), rtol=1e-6)
    np.testing.assert_allclose(weights["obs_rms.var"].numpy(), whole.var(0), rtol=1e-3)
    assert weights["ret_rms.count"].item() == pytest.approx(len(whole) + 1e-4)
    assert weights["ret_rms.var"].item() > 1.0  # Pendulum's returns are in the hundreds
    # data-parallel: each replica's averaged statistics give the same merge as one learner
    twin = ActorCriticLearner(0, 0, seed=0, hp=PPOHyper(1, 2), network=lambda: (
        actor_critic_for(*spaces, (16,), NORM)), replicas=2)
    twin.load_state_dict(learner.state_dict())
    one = ActorCriticLearner(0, 0, seed=0, hp=PPOHyper(1, 2), network=lambda: (
        actor_critic_for(*spaces, (16,), NORM)))
    one.load_state_dict(learner.state_dict())
    avg = (twin.statistics(batches[:1]) + twin.statistics(batches[1:])) / 2
    twin.minibatches(batches[:1], 0.0, avg)  # replica 0 sees its own batch and the average
    twin.finish_update([{"x": 0.0}])
    one.minibatches(batches, 0.0)
    one.finish_update([{"x": 0.0}])
    for key in ("obs_rms.mean", "obs_rms.var", "obs_rms.count", "ret_rms.var"):
        torch.testing.assert_close(twin.weights()[key], one.weights()[key], rtol=1e-9, atol=0)
    # the exported policy normalises with the merged statistics
    pi = policy_module("Pendulum-v1", (16,), weights, normalization=NORM)
    obs = torch.tensor(whole[:5], dtype=torch.float32)
    z = ((obs - weights["obs_rms.mean"].float()) / torch.sqrt(weights["obs_rms.var"].float() + EPS))
    torch.testing.assert_close(pi(obs), learner.net.actor_mean(z.clamp(-10, 10)).clamp(-2, 2))
    assert torch.jit.script(pi)(obs).shape == (5, 1)


def _run(client: Client, algo, spec: str, out: Path, iterations: int = 2) -> dict:
    settings = RunSettings(out=out, steps=iterations * algo.steps_per_iteration, seed=3,
                           eval=False, progress=False, tensorboard=False, deterministic=True)
    return train(client, algo, get_distribution(spec), settings)


@pytest.mark.parametrize("spec", ["actors-learner", "data-parallel"])
def test_statistics_are_identical_on_one_and_two_workers(cluster_pair, cluster_tiny_ppo, tmp_path,
                                                         spec):
    algo = cluster_tiny_ppo(env="Pendulum-v1", num_envs=2, hidden=16)
    one = _run(cluster_pair[1], algo, spec, tmp_path / "one")
    two = _run(cluster_pair[2], algo, spec, tmp_path / "two")
    assert len(set(sum(two["placement"].values(), []))) == 2, two["placement"]
    assert one["weights_sha256"] == two["weights_sha256"]
    ckpt = sorted((tmp_path / "two" / "checkpoints").glob("ckpt-*.pt"))[-1]
    model = torch.load(ckpt, weights_only=False)["learner"]["model"]
    # every transition of both iterations was merged (plus gymnasium's 1e-4 prior count)
    assert model["obs_rms.count"].item() == pytest.approx(2 * algo.steps_per_iteration + 1e-4)


MUJOCO = ["Hopper-v5", "HalfCheetah-v5", "Walker2d-v5"]


@pytest.mark.parametrize("spec", ["actors-learner", "single", "data-parallel",
                                  "central-inference", "actors-learner:stale=1"])
def test_mujoco_runs_under_every_distribution_that_serves_ppo(cluster_pair, cluster_tiny_ppo,
                                                              tmp_path, spec):
    pytest.importorskip("mujoco")
    for env in MUJOCO:
        algo = cluster_tiny_ppo(env=env, num_envs=2, num_steps=16, hidden=16)
        summary = _run(cluster_pair[2], algo, spec, tmp_path / env, iterations=1)
        model = torch.load(sorted((tmp_path / env / "checkpoints").glob("ckpt-*.pt"))[-1],
                           weights_only=False)["learner"]["model"]
        obs_dim = env_spaces(env)[0].shape[0]
        assert model["obs_rms.mean"].shape == (obs_dim,), env
        assert model["obs_rms.count"].item() > algo.steps_per_iteration / 2, (env, spec)
        assert summary["weights_sha256"]


def test_a2c_on_box_actions_actor_and_learner_compute_the_same_gradients():
    from daskrl.algos.a2c import A2CActor, A2CHyper, A2CLearner

    spaces = env_spaces("Pendulum-v1")
    learner = A2CLearner(0, 0, seed=0, hidden=(16,), hp=A2CHyper(),
                         network=lambda: actor_critic_for(*spaces, (16,)))
    actor = A2CActor("Pendulum-v1", 2, seed=0, hidden=(16,), rollout_steps=8)
    actor.set_weights(learner.weights(), 0)
    kept, rollout = [], actor.rollout
    actor.rollout = lambda n: kept.append(rollout(n)) or kept[-1]
    grads, _ = actor.gradients()
    assert kept[0]["actions"].shape == (16, 1) and kept[0]["actions"].dtype == np.float32
    (mb,) = learner.minibatches(kept, 0.0)
    mine, _ = learner.compute_gradients(mb)
    for a, b in zip(grads, mine, strict=True):
        torch.testing.assert_close(a, b)
    names = [name for name, _ in learner.net.named_parameters()]
    assert mine[names.index("actor_logstd")].abs().sum() > 0  # the log std is learnt too
