"""V-trace (daskrl.algos.losses.vtrace) against references written out independently here."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from daskrl.algos.gae import gae
from daskrl.algos.losses import vtrace


def reference(mu: list[float], pi: list[float], r: list[float], v: list[float], boot: float,
              disc: list[float], rho_bar: float = 1.0, c_bar: float = 1.0
              ) -> tuple[list[float], list[float]]:
    """One env's V-trace by the paper's sum (eq. 1), not the recursion:

    vs_s = V_s + sum_{t >= s} (prod_{i=s}^{t-1} disc_i c_i) rho_t (r_t + disc_t V_{t+1} - V_t).
    """
    n = len(r)
    ratio = [math.exp(p - m) for p, m in zip(pi, mu, strict=True)]
    rho = [min(rho_bar, x) for x in ratio]
    c = [min(c_bar, x) for x in ratio]
    vnext = v[1:] + [boot]
    vs = []
    for s in range(n):
        total, weight = v[s], 1.0
        for t in range(s, n):
            total += weight * rho[t] * (r[t] + disc[t] * vnext[t] - v[t])
            weight *= disc[t] * c[t]
        vs.append(total)
    vs_next = vs[1:] + [boot]
    adv = [rho[t] * (r[t] + disc[t] * vs_next[t] - v[t]) for t in range(n)]
    return vs, adv


def run(mu, pi, r, v, boot, disc, **kw):
    """vtrace on one env (B = 1), as Python lists."""
    col = lambda x: torch.tensor(x, dtype=torch.float64)[:, None]  # noqa: E731
    vs, adv = vtrace(col(mu), col(pi), col(r), col(v), torch.tensor([boot], dtype=torch.float64),
                     col(disc), **kw)
    return vs[:, 0].tolist(), adv[:, 0].tolist()


def test_hand_computed_three_steps() -> None:
    # ratios pi/mu: e^0 = 1, e^{ln 2} = 2 (truncated to 1), e^{ln 0.5} = 0.5
    mu = [0.0, 0.0, 0.0]
    pi = [0.0, math.log(2.0), math.log(0.5)]
    r, v, boot, g = [1.0, 2.0, 3.0], [0.5, 1.0, 1.5], 2.0, 0.9
    # by hand, rho = c = [1, 1, 0.5]; vs_t = V_t + delta_t + g * c_t * (vs_{t+1} - V_{t+1}):
    # delta_2 = 0.5 * (3 + 0.9 * 2 - 1.5) = 1.65   vs_2 = 1.5 + 1.65 = 3.15
    # delta_1 = 1 * (2 + 0.9 * 1.5 - 1) = 2.35     vs_1 = 1 + 2.35 + 0.9 * 1 * (3.15 - 1.5) = 4.835
    # delta_0 = 1 * (1 + 0.9 * 1 - 0.5) = 1.4      vs_0 = 0.5 + 1.4 + 0.9 * 1 * (4.835 - 1)
    #                                                   = 5.3515
    # adv_t = rho_t * (r_t + g * vs_{t+1} - V_t):
    # adv_2 = 0.5 * (3 + 0.9 * 2 - 1.5) = 1.65
    # adv_1 = 1 * (2 + 0.9 * 3.15 - 1) = 3.835
    # adv_0 = 1 * (1 + 0.9 * 4.835 - 0.5) = 4.8515
    vs, adv = run(mu, pi, r, v, boot, [g] * 3)
    assert vs == pytest.approx([5.3515, 4.835, 3.15])
    assert adv == pytest.approx([4.8515, 3.835, 1.65])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matches_the_paper_sum_off_policy(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = 7
    mu, pi = rng.normal(-1, 0.5, n).tolist(), rng.normal(-1, 0.5, n).tolist()
    r, v = rng.normal(size=n).tolist(), rng.normal(size=n).tolist()
    disc = [0.0 if x < 0.2 else 0.97 for x in rng.random(n)]
    for rho_bar, c_bar in [(1.0, 1.0), (2.0, 0.8), (math.inf, math.inf)]:
        got = run(mu, pi, r, v, 0.3, disc, rho_bar=rho_bar, c_bar=c_bar)
        want = reference(mu, pi, r, v, 0.3, disc, rho_bar, c_bar)
        assert got[0] == pytest.approx(want[0]) and got[1] == pytest.approx(want[1])


def test_on_policy_is_n_step_return_and_gae_lambda_one() -> None:
    rng = np.random.default_rng(3)
    T, B, g = 6, 4, 0.99
    logp = torch.tensor(rng.normal(-0.7, 0.2, (T, B)))
    rewards, values = rng.normal(size=(T, B)), rng.normal(size=(T, B))
    boot = rng.normal(size=B)
    term = rng.random((T, B)) < 0.25
    vs, adv = vtrace(logp, logp, torch.tensor(rewards), torch.tensor(values), torch.tensor(boot),
                     torch.tensor(g * (1.0 - term)))
    # n-step bootstrapped return, summed by hand: rewards until the episode ends or the
    # rollout does, then the bootstrap value if it did not end
    for b in range(B):
        for s in range(T):
            ret, scale = 0.0, 1.0
            for t in range(s, T):
                ret += scale * rewards[t, b]
                if term[t, b]:
                    break
                scale *= g
            else:
                ret += scale * boot[b]
            assert vs[s, b].item() == pytest.approx(ret)
    next_values = np.concatenate([values[1:], boot[None]])
    want_adv, want_ret = gae(rewards, values, next_values, term, term, g, 1.0)
    np.testing.assert_allclose(vs.numpy(), want_ret, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(adv.numpy(), want_adv, rtol=1e-5, atol=1e-5)


def test_truncation_by_rho_bar_and_c_bar() -> None:
    # every ratio is e = 2.718...: rho_bar and c_bar cap it
    mu, pi = [0.0] * 4, [1.0] * 4
    r, v, boot, disc = [1.0, 0.0, 2.0, 1.0], [0.1, 0.2, 0.3, 0.4], 1.0, [0.9] * 4
    for rho_bar, c_bar in [(1.0, 1.0), (1.5, 0.5), (math.inf, 1.0), (1.0, math.inf)]:
        got = run(mu, pi, r, v, boot, disc, rho_bar=rho_bar, c_bar=c_bar)
        want = reference(mu, pi, r, v, boot, disc, rho_bar, c_bar)
        assert got[0] == pytest.approx(want[0]) and got[1] == pytest.approx(want[1])
    capped = run(mu, pi, r, v, boot, disc, rho_bar=1.0, c_bar=1.0)
    free = run(mu, pi, r, v, boot, disc, rho_bar=math.inf, c_bar=math.inf)
    assert capped[0] != pytest.approx(free[0])
    # the last step's target depends only on rho (no trace after it): rho_bar = 1 gives the
    # on-policy one-step target r + gamma * V(boot)
    assert capped[0][3] == pytest.approx(1.0 + 0.9 * 1.0)


def test_episode_boundary_cuts_the_trace() -> None:
    mu, pi = [0.0] * 4, [0.2, -0.1, 0.3, 0.0]
    v, disc = [0.5, 0.1, 0.2, 0.3], [0.9, 0.0, 0.9, 0.9]  # the episode ends at step 1
    a = run(mu, pi, [1.0, 1.0, 1.0, 1.0], v, 2.0, disc)
    b = run(mu, pi, [1.0, 1.0, -5.0, 7.0], v, -3.0, disc)  # what follows the end changes
    assert a[0][:2] == pytest.approx(b[0][:2]) and a[1][:2] == pytest.approx(b[1][:2])
    # at the end step: rho * r (no bootstrap), rho = min(1, e^-0.1)
    assert a[0][1] == pytest.approx(0.1 + math.exp(-0.1) * (1.0 - 0.1))


def test_invalid_reset_step_bootstraps_a_truncated_episode() -> None:
    # step 1 was truncated (discount stays gamma), step 2 is the vector env's reset step:
    # step 1 must bootstrap on V(final obs) = values[2], and nothing after crosses over
    g = 0.9
    mu = torch.zeros(4, 1)
    rewards = torch.tensor([[1.0], [1.0], [0.0], [9.0]])
    values = torch.tensor([[0.5], [0.4], [3.0], [1.0]])
    valid = torch.tensor([[True], [True], [False], [True]])
    disc = torch.full((4, 1), g)
    vs, adv = vtrace(mu, mu, rewards, values, torch.tensor([2.0]), disc, valid=valid)
    assert vs[1, 0].item() == pytest.approx(1.0 + g * 3.0)
    assert vs[2, 0].item() == pytest.approx(3.0)  # its own value: masked out of any loss
    assert vs[0, 0].item() == pytest.approx(1.0 + g * (1.0 + g * 3.0))
    assert adv[1, 0].item() == pytest.approx(1.0 + g * 3.0 - 0.4)


def test_no_gradient_flows_through_the_targets() -> None:
    target = torch.zeros(3, 2, requires_grad=True)
    values = torch.ones(3, 2, requires_grad=True)
    vs, adv = vtrace(torch.zeros(3, 2), target, torch.ones(3, 2), values, torch.zeros(2),
                     torch.full((3, 2), 0.9))
    assert not vs.requires_grad and not adv.requires_grad


def test_learner_targets_on_policy_are_gae_lambda_one_on_its_own_values() -> None:
    from daskrl.algos.ppo import PPOHyper
    from daskrl.algos.vtrace import SequenceActor, VTraceLearner

    learner = VTraceLearner(4, 2, seed=0, hp=PPOHyper(update_epochs=1, num_minibatches=1),
                            loss="ppo")
    actor = SequenceActor("CartPole-v1", num_envs=3, seed=1, gamma=0.9)
    actor.set_weights(learner.weights(), 0)
    batch = actor.rollout(40)  # CartPole's early episodes end inside 40 steps
    assert not batch["valid"].all()
    (mb,) = learner.minibatches([batch], 0.0)
    # reference: GAE(lambda=1) over the valid steps, on the learner's values, time-major
    with torch.no_grad():
        v = learner.net.value(torch.as_tensor(batch["obs"]).reshape(-1, 4)).reshape(3, 40).numpy()
        boot = learner.net.value(torch.as_tensor(batch["last_obs"])).numpy()
    rewards, valid = batch["rewards"].T, batch["valid"].T
    terminated = batch["discounts"].T == 0
    next_values = np.concatenate([v.T[1:], boot[None]])
    done = np.concatenate([~valid[1:], np.zeros((1, 3), bool)])  # a reset step follows an end
    _, returns = gae(rewards, v.T, next_values, terminated, done, 0.9, 1.0)
    want = np.sort(returns[valid])
    np.testing.assert_allclose(np.sort(mb["returns"].numpy()), want, rtol=1e-4, atol=1e-4)
    assert len(mb["obs"]) == int(valid.sum()) == batch["stats"]["env_steps"]
