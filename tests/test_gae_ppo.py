"""GAE and PPO maths against hand-computed values, hand-written gradients against autograd."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from daskrl.algos.gae import gae
from daskrl.algos.networks import DiscreteActorCritic, FlatParameters
from daskrl.algos.optim import FlatAdam
from daskrl.algos.ppo import PPOHyper, normalize, policy_loss, ppo_loss, ppo_update, value_loss
from daskrl.algos.ppo_grads import ppo_grads, supports

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
            "returns": (scale * rng.normal(size=n)).astype(np.float32)}


def count_steps(optimizer):
    steps = []
    optimizer.register_step_post_hook(lambda opt, args, kwargs: steps.append(1))
    return steps


@pytest.mark.parametrize("n, epochs, minibatches", [(16, 3, 4), (12, 2, 3), (8, 1, 1)])
def test_ppo_update_runs_epochs_times_minibatches_steps(n, epochs, minibatches):
    net = Recording()
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    steps = count_steps(opt)
    hp = PPOHyper(update_epochs=epochs, num_minibatches=minibatches)
    out = ppo_update(net, opt, batch_of(n), hp, torch.Generator().manual_seed(0))
    assert len(steps) == epochs * minibatches
    size = n // minibatches
    assert [len(mb) for mb in net.minibatches] == [size] * (epochs * minibatches)
    for e in range(epochs):  # every sample exactly once per epoch, in shuffled minibatches
        epoch = net.minibatches[e * minibatches:(e + 1) * minibatches]
        assert sorted(i for mb in epoch for i in mb) == list(range(n))
    assert set(out) >= {"losses/policy_loss", "losses/value_loss", "losses/entropy",
                        "losses/approx_kl", "losses/clipfrac", "losses/explained_variance"}


def test_ppo_update_keeps_the_minibatch_count_when_n_does_not_divide():
    net = Recording()
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    steps = count_steps(opt)
    ppo_update(net, opt, batch_of(9), PPOHyper(update_epochs=2, num_minibatches=4),
               torch.Generator().manual_seed(0))
    assert len(steps) == 2 * 4


def test_ppo_update_clips_the_gradient_norm():
    net = DiscreteActorCritic(4, 2, (16, 16))
    opt = torch.optim.SGD(net.parameters(), lr=1e-3)
    params = list(net.parameters())
    before, after = [], []

    def norm(grads):
        return float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads])))

    opt.register_step_pre_hook(
        lambda o, args, kwargs: after.append(norm([p.grad for p in params])))
    hp = PPOHyper(update_epochs=2, num_minibatches=2, max_grad_norm=0.5, norm_adv=False)
    ppo_update(net, opt, batch_of(32, scale=1000.0), hp, torch.Generator().manual_seed(1),
               grad_hook=lambda grads: before.append(norm(grads)))
    assert len(before) == len(after) == 4
    assert min(before) > 0.5  # the gradients were large ...
    assert max(after) <= 0.5 + 1e-4  # ... and clipped to max_grad_norm before each step


def test_ppo_update_sets_the_learning_rate_and_stops_early_on_kl():
    net = Recording()
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    steps = count_steps(opt)
    hp = PPOHyper(update_epochs=4, num_minibatches=2, target_kl=-1.0)  # always exceeded
    ppo_update(net, opt, batch_of(8), hp, torch.Generator().manual_seed(0), lr=0.0123)
    assert opt.param_groups[0]["lr"] == 0.0123
    assert len(steps) == 2  # one epoch, then the KL check stops the update


def test_ppo_update_is_reproducible_with_a_seeded_generator():
    outs = []
    for _ in range(2):
        torch.manual_seed(0)
        net = DiscreteActorCritic(4, 2, (16, 16))
        opt = torch.optim.Adam(net.parameters(), lr=1e-3)
        ppo_update(net, opt, batch_of(16), PPOHyper(), torch.Generator().manual_seed(3))
        outs.append(net.state_dict())
    for k in outs[0]:
        torch.testing.assert_close(outs[0][k], outs[1][k])


@pytest.mark.parametrize("use_numpy", [True, False])
@pytest.mark.parametrize("norm_adv", [True, False])
@pytest.mark.parametrize("clip_vloss", [True, False])
def test_hand_written_gradients_equal_autograd(norm_adv, clip_vloss, use_numpy):
    torch.manual_seed(0)
    net = DiscreteActorCritic(4, 3, (16, 16))
    hp = PPOHyper(norm_adv=norm_adv, clip_vloss=clip_vloss, ent_coef=0.05, vf_coef=0.7)
    assert supports(net) and not supports(Recording())
    n = 64
    obs = torch.randn(n, 4)
    actions = torch.randint(0, 3, (n,))
    with torch.no_grad():
        logp_now, _, v_now = net.evaluate(obs, actions)
    # old log-probs and values: a third equal to now (ratio 1: ties between the clipped and
    # unclipped terms), a third a little off (inside the clip range), a third far off
    off = torch.cat([torch.zeros(n // 3), 0.05 * torch.randn(n // 3),
                     torch.randn(n - 2 * (n // 3))])
    mb = {"obs": obs, "actions": actions, "logp": logp_now + off, "values": v_now - 2 * off,
          "advantages": torch.randn(n), "returns": v_now + torch.randn(n)}
    loss, parts = ppo_loss(net, mb, hp)
    net.zero_grad()
    loss.backward()
    expected = [p.grad.clone() for p in net.parameters()]
    for p in net.parameters():
        p.grad = torch.full_like(p, 123.0)  # overwritten, not added to
    mine = ppo_grads(net, mb, hp, use_numpy=use_numpy)
    for name, p, g in zip(dict(net.named_parameters()), net.parameters(), expected,
                          strict=True):
        torch.testing.assert_close(p.grad, g, rtol=1e-5, atol=1e-6, msg=name)
    for key, value in parts.items():
        torch.testing.assert_close(mine[key], value.detach(), msg=key)


def test_ppo_update_by_hand_matches_autograd_step_for_step():
    """Two identical nets, one updated through the hand-written gradients (a plain
    DiscreteActorCritic), one through autograd (a subclass): the same weights after."""

    class Autograd(DiscreteActorCritic):
        pass

    batch = batch_of(48)
    nets = []
    for cls in (DiscreteActorCritic, Autograd):
        torch.manual_seed(5)
        net = cls(4, 2, (16, 16))
        opt = torch.optim.Adam(net.parameters(), lr=1e-2, eps=1e-5)
        ppo_update(net, opt, batch, PPOHyper(update_epochs=2, num_minibatches=3),
                   torch.Generator().manual_seed(3))
        nets.append(net)
    assert supports(nets[0]) and not supports(nets[1])
    for (name, a), b in zip(nets[0].state_dict().items(), nets[1].state_dict().values(),
                            strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=name)


def test_flat_adam_steps_like_torch_adam_and_resumes_from_its_state():
    torch.manual_seed(1)
    ours, ref = DiscreteActorCritic(4, 2, (8, 8)), DiscreteActorCritic(4, 2, (8, 8))
    ref.load_state_dict(ours.state_dict())
    flat = FlatParameters(ours)
    opt = FlatAdam(flat.tensor, lr=1e-2, eps=1e-5)
    ref_opt = torch.optim.Adam(ref.parameters(), lr=1e-2, eps=1e-5)
    for step in range(5):
        grads = [torch.randn_like(p) for p in ref.parameters()]
        for p, q, g in zip(ours.parameters(), ref.parameters(), grads, strict=True):
            p.grad.copy_(g)
            q.grad = g.clone()
        opt.step()
        ref_opt.step()
        if step == 2:  # a resumed optimiser continues exactly
            state = {k: v for k, v in opt.state_dict().items()}
            opt = FlatAdam(flat.tensor, lr=1.0)
            opt.load_state_dict(state)
    for (name, a), b in zip(ours.state_dict().items(), ref.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, msg=name)
    with pytest.raises(ValueError, match="one state per parameter"):
        opt.load_state_dict(ref_opt.state_dict())
