"""The reference limit in benchmarks/ (hand-derived PPO gradients) agrees with autograd, so the
benchmark that compares daskrl's general path against it compares the same maths."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from script_loader import BENCH, script

from daskrl.algos.ppo import PPOHyper, ppo_loss


@pytest.fixture(scope="module")
def hand():
    with script(BENCH / "hand_kernel.py", "hand_kernel") as module:
        yield module


@pytest.mark.parametrize("clip_vloss", [True, False])
def test_the_hand_gradients_equal_autograd_s_on_the_same_minibatch(hand, clip_vloss):
    hp = PPOHyper(ent_coef=0.05, vf_coef=0.7, clip_vloss=clip_vloss)
    learner = hand.HandLearner(4, 3, 0, (16, 16), hp)
    rng = np.random.default_rng(0)
    n = 64
    batch = {"obs": rng.normal(size=(n, 4)).astype(np.float32),
             "actions": rng.integers(0, 3, n), "logp": np.full(n, -1.0, np.float32),
             "values": rng.normal(size=n).astype(np.float32),
             "advantages": rng.normal(size=n).astype(np.float32),
             "returns": rng.normal(size=n).astype(np.float32), "stats": {}}
    mb = learner.minibatches([batch], 0.0)[0]
    loss, _ = ppo_loss(learner.net, mb, hp)
    expected = torch.autograd.grad(loss, learner.params)
    hand.hand_gradients(learner.actor_views, learner.critic_views,
                        {k: v.numpy() for k, v in mb.items()}, hp)
    grads = [g for layer in learner.actor_views + learner.critic_views for g in layer[2:]]
    assert len(grads) == len(expected) == 12  # weight and bias of 3 layers, actor and critic
    for g, e in zip(grads, expected, strict=True):
        np.testing.assert_allclose(g, e.numpy(), rtol=1e-4, atol=1e-6)
