"""GAE and PPO maths against hand-computed values; the learner's update by autograd and
torch.optim."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from daskrl.algos import losses
from daskrl.algos.a2c import A2CActor, A2CHyper, A2CLearner
from daskrl.algos.categorical import DiscreteActorCritic, sample
from daskrl.algos.gae import gae
from daskrl.algos.learner import ActorCriticLearner
from daskrl.algos.losses import normalize, policy_loss, value_loss
from daskrl.algos.ppo import PPOHyper, ppo_loss

pytestmark = pytest.mark.timeout(60)

# --------------------------------------------------------------------------- GAE

REWARDS = np.array([[1.0], [2.0], [3.0]], dtype=np.float32)
VALUES = np.array([[0.5], [1.0], [1.5]], dtype=np.float32)
NEXT_VALUES = np.array([[1.0], [1.5], [2.0]], dtype=np.float32)
NO = np.zeros((3, 1), dtype=bool)
G, L = 0.9, 0.8  # gamma, lambda; gamma * lambda = 0.72


def flags(*steps):
    out = np.zeros((3, 1), dtype=bool)
    out[list(steps), 0] = True
    return out


def test_gae_without_episode_ends():
    # deltas: 1 + .9*1 - .5 = 1.4, 2 + .9*1.5 - 1 = 2.35, 3 + .9*2 - 1.5 = 3.3
    adv, ret = gae(REWARDS, VALUES, NEXT_VALUES, NO, NO, G, L)
    np.testing.assert_allclose(adv[:, 0], [1.4 + 0.72 * 4.726, 2.35 + 0.72 * 3.3, 3.3], rtol=1e-6)
    np.testing.assert_allclose(ret, adv + VALUES, rtol=1e-6)
    assert adv.dtype == np.float32 and ret.dtype == np.float32


def test_gae_termination_does_not_bootstrap_and_cuts_the_recursion():
    # step 1 ends in a terminal state: delta_1 = 2 - 1 = 1 (no value of the next state),
    # and step 2 (the next episode) does not flow back into step 1
    adv, _ = gae(REWARDS, VALUES, NEXT_VALUES, flags(1), flags(1), G, L)
    np.testing.assert_allclose(adv[:, 0], [1.4 + 0.72 * 1.0, 1.0, 3.3], rtol=1e-6)


def test_gae_truncation_bootstraps_from_the_final_observation_and_cuts_the_recursion():
    # step 1 is truncated: delta_1 = 2 + .9 * V(final obs) - 1 = 2.35, recursion cut
    adv, _ = gae(REWARDS, VALUES, NEXT_VALUES, NO, flags(1), G, L)
    np.testing.assert_allclose(adv[:, 0], [1.4 + 0.72 * 2.35, 2.35, 3.3], rtol=1e-6)


def test_gae_episode_end_at_the_last_step():
    term, trunc = gae(REWARDS, VALUES, NEXT_VALUES, flags(2), flags(2), G, L)[0], gae(
        REWARDS, VALUES, NEXT_VALUES, NO, flags(2), G, L)[0]
    np.testing.assert_allclose(term[:, 0], [1.4 + 0.72 * (2.35 + 0.72 * 1.5),
                                            2.35 + 0.72 * 1.5, 1.5], rtol=1e-6)
    np.testing.assert_allclose(trunc[:, 0], [1.4 + 0.72 * 4.726, 4.726, 3.3], rtol=1e-6)


def test_gae_envs_are_independent():
    rewards, values, nxt = (np.repeat(a, 2, axis=1) for a in (REWARDS, VALUES, NEXT_VALUES))
    term = np.concatenate([NO, flags(1)], axis=1)
    adv, _ = gae(rewards, values, nxt, term, term, G, L)
    np.testing.assert_allclose(adv[:, 0], gae(REWARDS, VALUES, NEXT_VALUES, NO, NO, G, L)[0][:, 0])
    np.testing.assert_allclose(adv[:, 1], [2.12, 1.0, 3.3], rtol=1e-6)


def test_gae_lambda_limits():
    # lambda = 0: one-step TD errors; lambda = 1, gamma = 1: Monte-Carlo return minus value
    td, _ = gae(REWARDS, VALUES, NEXT_VALUES, NO, NO, G, 0.0)
    np.testing.assert_allclose(td[:, 0], [1.4, 2.35, 3.3], rtol=1e-6)
    mc, ret = gae(REWARDS, VALUES, NEXT_VALUES, flags(2), flags(2), 1.0, 1.0)
    np.testing.assert_allclose(ret[:, 0], [6.0, 5.0, 3.0], rtol=1e-6)
    np.testing.assert_allclose(mc[:, 0], [5.5, 4.0, 1.5], rtol=1e-6)


# --------------------------------------------------------------------------- PPO losses


def test_normalize():
    out = normalize(torch.tensor([1.0, 2.0, 3.0, 4.0]))
    std = math.sqrt(5 / 3)  # unbiased, as CleanRL
    torch.testing.assert_close(out, torch.tensor([-1.5, -0.5, 0.5, 1.5]) / std)
    torch.testing.assert_close(normalize(torch.tensor([2.0, 2.0])), torch.zeros(2))


def test_policy_loss_takes_the_pessimistic_side_of_the_clip():
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0])
    ratio = torch.tensor([1.5, 0.5, 0.5, 1.5])
    # per sample: max(-A r, -A clip(r)) = -1.2, 0.8, -0.5, 1.5
    assert policy_loss(adv, ratio, 0.2).item() == pytest.approx(0.15)
    assert policy_loss(adv, torch.ones(4), 0.2).item() == pytest.approx(0.0)


def test_value_loss_clipped_and_unclipped():
    new, old, ret = torch.tensor([2.0, 0.5]), torch.zeros(2), torch.tensor([0.0, 1.0])
    # clipped values 0.2, 0.2: squared errors max(4, .04) = 4 and max(.25, .64) = .64
    assert value_loss(new, old, ret, 0.2).item() == pytest.approx(0.5 * (4 + 0.64) / 2)
    assert value_loss(new, old, ret, 0.2, clip=False).item() == pytest.approx(0.5 * 4.25 / 2)


class Scripted(nn.Module):
    """A network whose outputs are read from the observations: (logp, entropy, value)."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(()))

    def evaluate(self, obs, actions):
        return obs[:, 0] + self.w, obs[:, 1] + 0 * self.w, obs[:, 2] + self.w


def scripted_minibatch():
    obs = torch.tensor([[math.log(1.5), 0.6, 2.0], [math.log(0.5), 0.4, 0.5]])
    return {"obs": obs, "actions": torch.zeros(2), "logp": torch.zeros(2),
            "values": torch.zeros(2), "advantages": torch.tensor([1.0, -1.0]),
            "returns": torch.tensor([0.0, 1.0])}


@pytest.mark.parametrize("norm_adv, pg", [(False, -0.2), (True, -0.2 / math.sqrt(2))])
def test_ppo_loss_against_hand_computed_parts(norm_adv, pg):
    hp = PPOHyper(norm_adv=norm_adv, clip_coef=0.2, ent_coef=0.01, vf_coef=0.5)
    loss, parts = ppo_loss(Scripted(), scripted_minibatch(), hp)
    vf, ent = 0.5 * (4 + 0.64) / 2, 0.5
    assert parts["losses/policy_loss"].item() == pytest.approx(pg, rel=1e-5)
    assert parts["losses/value_loss"].item() == pytest.approx(vf, rel=1e-6)
    assert parts["losses/entropy"].item() == pytest.approx(ent, rel=1e-6)
    assert loss.item() == pytest.approx(pg - 0.01 * ent + 0.5 * vf, rel=1e-5)
    kl = ((0.5 - math.log(1.5)) + (-0.5 - math.log(0.5))) / 2
    assert parts["losses/approx_kl"].item() == pytest.approx(kl, rel=1e-5)
    assert parts["losses/clipfrac"].item() == 1.0
    assert loss.requires_grad


# --------------------------------------------------------------------------- PPO update


class Recording(DiscreteActorCritic):
    """The real network, noting which samples each minibatch holds."""

    def __init__(self):
        super().__init__(4, 2, (16, 16))
        self.minibatches: list[list[int]] = []

    def evaluate(self, obs, actions):
        self.minibatches.append(sorted(int(i) for i in obs[:, 3]))
        return super().evaluate(obs, actions)


def batch_of(n, scale=1.0, seed=0):
    rng = np.random.default_rng(seed)
    obs = rng.normal(size=(n, 4)).astype(np.float32)
    obs[:, 3] = np.arange(n)  # sample ids
    return {"obs": obs, "actions": rng.integers(0, 2, n),
            "logp": np.full(n, math.log(0.5), np.float32),
            "values": np.zeros(n, np.float32),
            "advantages": (scale * rng.normal(size=n)).astype(np.float32),
            "returns": (scale * rng.normal(size=n)).astype(np.float32),
            "stats": {}}


def learner_with(net, hp, seed=0):
    """An ActorCriticLearner whose network is ``net`` (its optimiser rebuilt for it)."""
    learner = ActorCriticLearner(4, 2, seed, (16, 16), hp)
    learner.net = net
    learner.params = list(net.parameters())  # the optimiser is built over them on first use
    return learner


def count_steps(optimizer):
    steps = []
    optimizer.register_step_post_hook(lambda opt, args, kwargs: steps.append(1))
    return steps


@pytest.mark.parametrize("n, epochs, minibatches", [(16, 3, 4), (12, 2, 3), (8, 1, 1)])
def test_update_runs_epochs_times_minibatches_steps(n, epochs, minibatches):
    net = Recording()
    hp = PPOHyper(update_epochs=epochs, num_minibatches=minibatches)
    learner = learner_with(net, hp)
    steps = count_steps(learner.optimizer)
    out = learner.update([batch_of(n)], 0.0)
    assert len(steps) == epochs * minibatches == learner.update_plan().steps
    size = n // minibatches
    assert [len(mb) for mb in net.minibatches] == [size] * (epochs * minibatches)
    for e in range(epochs):  # every sample exactly once per epoch, in shuffled minibatches
        epoch = net.minibatches[e * minibatches:(e + 1) * minibatches]
        assert sorted(i for mb in epoch for i in mb) == list(range(n))
    assert set(out) >= {"losses/policy_loss", "losses/value_loss", "losses/entropy",
                        "losses/approx_kl", "losses/clipfrac", "losses/explained_variance",
                        "charts/learning_rate"}


def test_update_keeps_the_minibatch_count_when_n_does_not_divide():
    learner = learner_with(Recording(), PPOHyper(update_epochs=2, num_minibatches=4))
    steps = count_steps(learner.optimizer)
    assert len(learner.minibatches([batch_of(9)], 0.0)) == 8
    learner.update([batch_of(9)], 0.0)
    assert len(steps) == 2 * 4


def test_apply_gradients_clips_the_gradient_norm():
    hp = PPOHyper(update_epochs=2, num_minibatches=2, max_grad_norm=0.5, norm_adv=False)
    learner = ActorCriticLearner(4, 2, 0, (16, 16), hp)
    after = []

    def norm(grads):
        return float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads])))

    learner.optimizer.register_step_pre_hook(
        lambda o, args, kwargs: after.append(norm([p.grad for p in learner.params])))
    before = []
    for mb in learner.minibatches([batch_of(32, scale=1000.0)], 0.0):
        grads, _ = learner.compute_gradients(mb)
        before.append(norm(grads))
        learner.apply_gradients(grads)
    assert len(before) == len(after) == 4
    assert min(before) > 0.5  # the gradients were large ...
    assert max(after) <= 0.5 + 1e-4  # ... and clipped to max_grad_norm before each step


def test_compute_gradients_are_autograd_gradients_of_the_loss():
    hp = PPOHyper(ent_coef=0.05, vf_coef=0.7)
    learner = ActorCriticLearner(4, 3, 0, (16, 16), hp)
    mb = learner.minibatches([batch_of(16)], 0.0)[0]
    grads, parts = learner.compute_gradients(mb)
    loss, expected = ppo_loss(learner.net, mb, hp)
    learner.net.zero_grad()
    loss.backward()
    for (name, p), g in zip(learner.net.named_parameters(), grads, strict=True):
        torch.testing.assert_close(g, p.grad, msg=name)
    assert parts == pytest.approx({k: float(v) for k, v in expected.items()})


def test_update_sets_the_learning_rate_and_stops_early_on_kl():
    hp = PPOHyper(update_epochs=4, num_minibatches=2, target_kl=-1.0, learning_rate=0.02)
    learner = learner_with(Recording(), hp)
    steps = count_steps(learner.optimizer)
    out = learner.update([batch_of(8)], progress=0.25)
    assert learner.optimizer.param_groups[0]["lr"] == pytest.approx(0.015)  # annealed
    assert out["charts/learning_rate"] == pytest.approx(0.015)
    assert len(steps) == 2  # one epoch, then the KL check stops the update
    with pytest.raises(ValueError, match="target_kl"):
        learner.update_plan()  # replicas of a data-parallel run could stop apart


def test_update_is_reproducible_and_resumes_exactly():
    def run(split):
        learner = ActorCriticLearner(4, 2, 3, (16, 16), PPOHyper())
        for k in range(3):
            if k == split:  # a resumed learner: a fresh one loading the state
                state = learner.state_dict()
                learner = ActorCriticLearner(4, 2, 99, (16, 16), PPOHyper())
                learner.load_state_dict(state)
            learner.update([batch_of(16, seed=k)], k / 3)
        return learner.weights()

    straight, resumed = run(None), run(2)
    for k in straight:
        assert torch.equal(straight[k], resumed[k]), k


def test_update_steps_torch_adam():
    learner = ActorCriticLearner(4, 2, 0, (16, 16), PPOHyper())
    assert learner.state_dict()["optimizer"] is None  # not built before the first update
    assert type(learner.optimizer) is torch.optim.Adam
    assert learner.optimizer.defaults["eps"] == 1e-5  # as CleanRL
    before = {k: v.clone() for k, v in learner.weights().items()}
    learner.update([batch_of(16)], 0.0)
    assert len(learner.optimizer.state) == len(learner.params)
    assert any(not torch.equal(before[k], v) for k, v in learner.weights().items())


def test_compiled_loss_matches_the_eager_loss():
    pytest.importorskip("torch._inductor")
    eager = ActorCriticLearner(4, 2, 0, (16, 16), PPOHyper())
    fast = ActorCriticLearner(4, 2, 0, (16, 16), PPOHyper(), compile=True)
    mb = eager.minibatches([batch_of(16)], 0.0)[0]
    (g1, p1), (g2, p2) = eager.compute_gradients(mb), fast.compute_gradients(mb)
    for a, b in zip(g1, g2, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    assert p1 == pytest.approx(p2, rel=1e-4, abs=1e-6)


# --------------------------------------------------------------------------- A2C / A3C


def test_a2c_actor_and_learner_compute_the_same_gradients():
    learner = A2CLearner(4, 2, seed=0, hp=A2CHyper())
    actor = A2CActor("CartPole-v1", 2, seed=0, rollout_steps=4)
    actor.set_weights(learner.weights(), 0)
    snapshot = actor.rollout  # the actor's batch, kept to hand to the learner
    kept = []
    actor.rollout = lambda n: kept.append(snapshot(n)) or kept[-1]
    grads, stats = actor.gradients()
    (mb,) = learner.minibatches(kept, 0.0)
    mine, parts = learner.compute_gradients(mb)
    for a, b in zip(grads, mine, strict=True):
        torch.testing.assert_close(a, b)
    assert stats["losses/policy_loss"] == pytest.approx(parts["losses/policy_loss"])
    assert learner.update_plan().steps == 1
    learner.schedule(0.5)
    learner.apply_gradients(grads)
    assert learner.optimizer.param_groups[0]["lr"] == pytest.approx(5e-4)


def test_a2c_loss_parts():
    logp, ent = torch.tensor([-1.0, -2.0]), torch.tensor([0.5, 0.7])
    v, adv, ret = torch.tensor([0.0, 1.0]), torch.tensor([1.0, 3.0]), torch.tensor([1.0, 1.0])
    loss, parts = losses.a2c_loss(logp, ent, v, adv, ret, ent_coef=0.1, vf_coef=0.5)
    # pg = -(1 * -1 + 3 * -2) / 2 = 3.5; vf = 0.5 * (1 + 0) / 2 = 0.25; ent = 0.6
    assert parts.tolist() == pytest.approx([3.5, 0.25, 0.6])
    assert loss.item() == pytest.approx(3.5 + 0.5 * 0.25 - 0.1 * 0.6)


# --------------------------------------------------------------------------- inference


def test_actor_inference_samples_from_the_policy_with_a_seeded_generator():
    net = DiscreteActorCritic(4, 3, (16, 16))
    obs = np.random.default_rng(0).normal(size=(4000, 4)).astype(np.float32)
    a1, logp1, v1 = net.act(obs, torch.Generator().manual_seed(7))
    a2, _, _ = net.act(obs, torch.Generator().manual_seed(7))
    assert torch.equal(a1, a2)  # reproducible
    with torch.no_grad():
        logp, _, values = net.evaluate(torch.from_numpy(obs), a1.clone())
    torch.testing.assert_close(logp1, logp)
    torch.testing.assert_close(v1, values)
    # frequencies of a sample follow the policy's probabilities
    probs = torch.softmax(net.actor(torch.zeros(1, 4)), -1)[0].detach()
    counts = torch.bincount(sample(net.actor(torch.zeros(20000, 4)).detach(),
                                   torch.Generator().manual_seed(1))[0], minlength=3)
    torch.testing.assert_close(counts / 20000, probs, atol=0.02, rtol=0)
    greedy = net.act(obs, deterministic=True)[0]
    assert torch.equal(greedy, net.actor(torch.from_numpy(obs)).argmax(-1))
