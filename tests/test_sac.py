"""SAC on Pendulum-v1: runs under ``single`` on a real cluster and improves on the random
policy; its trained policy module maps observations to bounded actions; a discrete env is
refused in one line."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
import torch

from daskrl.algos.evaluation import evaluate_module
from daskrl.core.script import load_graph
from daskrl.distributions import get_distribution
from daskrl.runtime.driver import RunSettings, train

REPO = Path(__file__).resolve().parent.parent
GRAPH = load_graph(str(REPO / "graphs" / "sac.py"))

pytestmark = pytest.mark.timeout(300)



class _Uniform(torch.nn.Module):
    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.rand(obs.shape[0], 1) * 4 - 2


def test_sac_improves_on_pendulum(cluster_one_cpu, tmp_path):
    config = GRAPH.Config(hidden=64, num_envs=2, num_steps=100, eval_episodes=5,
                          batch_size=64)
    algo = GRAPH.build(config)
    summary = train(cluster_one_cpu, algo, get_distribution("single"),
                    RunSettings(out=tmp_path, steps=4000, seed=1, progress=False,
                                tensorboard=False))
    with (tmp_path / "metrics.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert float(rows[0]["random_actions"]) == 1  # uniform actions before learning starts
    assert float(rows[-1]["random_actions"]) == 0
    assert float(rows[-1]["losses/alpha"]) < 1.0  # the temperature was tuned down
    torch.manual_seed(0)
    random = evaluate_module("Pendulum-v1", _Uniform(), seed=5, episodes=5)["eval_return_mean"]
    # a random policy scores about -1200; 4000 updates of SAC already do clearly better
    assert summary["eval_return_mean"] > random + 200, (summary["eval_return_mean"], random)
    policy = algo.make_policy(GRAPH.make_learner(config, 0, "cpu").weights(), True)
    actions = policy(torch.zeros(7, 3))
    assert actions.shape == (7, 1) and bool((actions.abs() <= 2).all())


def test_discrete_env_is_refused_in_one_line():
    with pytest.raises(ValueError, match=r"^SAC needs a continuous \(Box\) action space, but "
                                         r"CartPole-v1's is Discrete\(2\)"):
        GRAPH.build(GRAPH.Config(env="CartPole-v1"))


def test_twin_q_targets_use_the_smaller_critic():
    from daskrl.algos.sac import SACHyper, SACLearner

    learner = SACLearner(3, np.array([-2.0]), np.array([2.0]), seed=0, hidden=(8,),
                         hyper=SACHyper(autotune=False, alpha=1e-8, tau=1.0))
    with torch.no_grad():  # critic 2 well below critic 1: the target takes critic 2's value
        learner.qf_target.q.biases[-1][0].fill_(100.0)
        learner.qf_target.q.biases[-1][1].fill_(-100.0)
        learner.qf_target.q.weights[-1].zero_()
    sample = {"obs": np.zeros((4, 3), np.float32), "actions": np.zeros((4, 1), np.float32),
              "rewards": np.ones(4, np.float32), "next_obs": np.zeros((4, 3), np.float32),
              "discounts": np.full(4, 0.5, np.float32)}
    learner.hyper = SACHyper(autotune=False, alpha=1e-8, q_lr=0.0, tau=1.0)
    for group in learner.q_optimizer.param_groups:
        group["lr"] = 0.0
    out = learner.gradient_step(sample)
    q1 = float(out["losses/qf1_values"])
    # loss = (q1 - target)^2 + (q2 - target)^2 with target = 1 + 0.5 * (-100) = -49
    with torch.no_grad():
        q1v, q2v = learner.qf(torch.zeros(4, 3), torch.zeros(4, 1))
    expected = ((q1v + 49) ** 2).mean() + ((q2v + 49) ** 2).mean()
    assert out["losses/qf_loss"] == pytest.approx(float(expected), rel=1e-4), q1


def test_gradient_step_matches_cleanrl_maths():
    """Four steps of the learner (twin critics stacked and evaluated as one, fused Adam, the
    actor's loss differentiated for the actor only, Polyak with one call) leave the same
    networks as CleanRL's plain loop over two separate critic modules."""
    import copy

    import torch.nn.functional as F

    from daskrl.algos.sac import SACHyper, SACLearner

    hyper = SACHyper(tau=0.1, policy_lr=1e-2, q_lr=1e-2)
    learner = SACLearner(3, np.array([-2.0]), np.array([2.0]), seed=0, hidden=(16,), hyper=hyper)
    actor = copy.deepcopy(learner.actor)
    q1n, q2n = learner.qf.q.unstacked()  # plain nn.Sequential critics, the same weights
    t1n, t2n = learner.qf_target.q.unstacked()
    assert isinstance(q1n[0], torch.nn.Linear)
    qf_params = [*q1n.parameters(), *q2n.parameters()]
    target_params = [*t1n.parameters(), *t2n.parameters()]

    def qf(o, a, n1=q1n, n2=q2n):
        x = torch.cat([o, a], -1)
        return n1(x).squeeze(-1), n2(x).squeeze(-1)

    log_alpha = learner.log_alpha.detach().clone().requires_grad_(True)
    q_opt = torch.optim.Adam(qf_params, lr=hyper.q_lr, foreach=False)
    actor_opt = torch.optim.Adam(actor.body.parameters(), lr=hyper.policy_lr, foreach=False)
    a_opt = torch.optim.Adam([log_alpha], lr=hyper.q_lr, foreach=False)
    rng = np.random.default_rng(0)
    samples = [{"obs": rng.normal(size=(8, 3)).astype(np.float32),
                "actions": rng.uniform(-2, 2, (8, 1)).astype(np.float32),
                "rewards": rng.normal(size=8).astype(np.float32),
                "next_obs": rng.normal(size=(8, 3)).astype(np.float32),
                "discounts": np.full(8, 0.99, np.float32)} for _ in range(4)]
    noise = torch.Generator()  # the reference draws the learner's own noise
    for sample in samples:
        noise.set_state(learner.generator.get_state())
        torch.manual_seed(0)  # the global generator is no part of the learner's update
        reported = learner.gradient_step(sample)
        obs, act, rew, nxt, disc = (torch.as_tensor(sample[f]) for f in (
            "obs", "actions", "rewards", "next_obs", "discounts"))
        alpha = log_alpha.exp().detach()
        with torch.no_grad():
            next_act, next_logp = actor.sample(nxt, noise)
            t1, t2 = qf(nxt, next_act, t1n, t2n)
            target = rew + disc * (torch.min(t1, t2) - alpha * next_logp)
        q1, q2 = qf(obs, act)
        q_opt.zero_grad()
        qf_loss = F.mse_loss(q1, target) + F.mse_loss(q2, target)
        qf_loss.backward()
        q_opt.step()
        pi, logp = actor.sample(obs, noise)
        p1, p2 = qf(obs, pi)
        actor_opt.zero_grad()
        actor_loss = (alpha * logp - torch.min(p1, p2)).mean()
        actor_loss.backward()
        actor_opt.step()
        # the losses reported are the plain loop's too (Adam alone would hide a scaled loss)
        assert reported["losses/qf_loss"] == pytest.approx(float(qf_loss), rel=1e-5)
        assert reported["losses/actor_loss"] == pytest.approx(float(actor_loss), rel=1e-5)
        with torch.no_grad():
            _, logp = actor.sample(obs, noise)
        a_opt.zero_grad()
        (-log_alpha.exp() * (logp + learner.target_entropy)).mean().backward()
        a_opt.step()
        with torch.no_grad():
            for t, p in zip(target_params, qf_params, strict=True):
                t.mul_(1 - hyper.tau).add_(p, alpha=hyper.tau)
    pairs = [(learner.actor, actor), *zip(learner.qf.q.unstacked(), (q1n, q2n), strict=True),
             *zip(learner.qf_target.q.unstacked(), (t1n, t2n), strict=True)]
    for mine, ref in pairs:
        for a, b in zip(mine.parameters(), ref.parameters(), strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(learner.log_alpha.detach(), log_alpha.detach())


def test_light_state_leaves_out_the_replay_and_a_learner_rebuilt_from_it_reports_the_loss(
        capsys):
    from daskrl.algos.sac import SACActor, SACHyper, SACLearner

    hyper = SACHyper(learning_starts=8, batch_size=4)
    learner = SACLearner(3, np.array([-2.0]), np.array([2.0]), seed=0, hidden=(8,), hyper=hyper)
    actor = SACActor("Pendulum-v1", 2, 0, (8,))
    learner.update([actor.rollout(8)], 0.0)
    full, light = learner.state_dict(), learner.light_state_dict()
    assert "replay" in full and "replay" not in light and light["light"]
    assert {k: v for k, v in full.items() if k != "replay"}.keys() == light.keys() - {"light"}
    rebuilt = SACLearner(3, np.array([-2.0]), np.array([2.0]), seed=1, hidden=(8,), hyper=hyper)
    rebuilt.load_state_dict(light)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "between checkpoints" in err[0] and "16 transitions lost" in err[0]
    for a, b in zip(rebuilt.qf.parameters(), learner.qf.parameters(), strict=True):
        torch.testing.assert_close(a, b)
    batch = actor.rollout(8)
    assert rebuilt.update([batch], 0.0)["replay_lost"] == 16 == len(learner.replay)
    assert rebuilt.update([actor.rollout(8)], 0.0)["replay_lost"] == 0  # reported once
    # a learner that still holds its replay (it went back a few updates) keeps it
    learner.load_state_dict(light)
    assert len(learner.replay) == 16 and capsys.readouterr().err == ""


def test_a_checkpoint_of_two_separate_critics_loads_into_the_stacked_ones():
    from daskrl.algos.box_control import TwinQ

    saved = TwinQ(3, 1, (8,))
    old = {f"q{j + 1}.{k}": v for j, member in enumerate(saved.q.unstacked())
           for k, v in member.state_dict().items()}  # the layout before the critics were stacked
    loaded = TwinQ(3, 1, (8,))
    loaded.load_state_dict(old)
    obs, act = torch.randn(5, 3), torch.randn(5, 1)
    for a, b in zip(loaded(obs, act), saved(obs, act), strict=True):
        torch.testing.assert_close(a, b)


def test_the_update_does_not_draw_from_torch_s_global_generator():
    """Tasks share their worker process's global generator: another task seeding or drawing
    from it between two updates (a learner or network being built) must not change them,
    and a learner restored from a state continues with the same noise."""
    from daskrl.algos.sac import SACActor, SACHyper, SACLearner

    hyper = SACHyper(learning_starts=8, batch_size=4)
    batch = SACActor("Pendulum-v1", 2, 0, (8,)).rollout(8)

    def two_updates(disturb: bool) -> tuple[dict, SACLearner]:
        learner = SACLearner(3, np.array([-2.0]), np.array([2.0]), seed=0, hidden=(8,),
                             hyper=hyper)
        learner.update([batch], 0.0)
        if disturb:
            torch.manual_seed(123)
            torch.rand(7)
        learner.update([batch], 0.0)
        return learner.weights(), learner

    calm, learner = two_updates(False)
    disturbed, _ = two_updates(True)
    for k in calm:
        torch.testing.assert_close(calm[k], disturbed[k], rtol=0, atol=0)
    restored = SACLearner(3, np.array([-2.0]), np.array([2.0]), seed=5, hidden=(8,),
                          hyper=hyper)
    restored.load_state_dict(learner.state_dict())
    assert torch.equal(restored.generator.get_state(), learner.generator.get_state())


@pytest.mark.parametrize("temperature_loss", ["alpha", "log_alpha"])
def test_the_temperature_loss_multiplies_what_it_says(temperature_loss: str):
    """The temperature's gradient in log space is alpha x (mean log-probability + target
    entropy) with CleanRL's loss, and that mean itself with the SAC authors' (SB3's)."""
    import math

    from daskrl.algos.sac import SACHyper, SACLearner

    learner = SACLearner(3, np.array([-2.0]), np.array([2.0]), seed=0, hidden=(16,),
                         hyper=SACHyper(temperature_loss=temperature_loss))
    learner.log_alpha.data.fill_(math.log(0.05))
    # plain SGD with a unit step shows the loss's gradient itself (Adam would hide its scale)
    learner.a_optimizer = torch.optim.SGD([learner.log_alpha], lr=1.0)
    obs = torch.randn(32, 3, generator=torch.Generator().manual_seed(1))
    noise, alpha_noise = learner._noise(obs), learner._noise(obs)
    learner._actor_fit(obs, noise, alpha_noise)
    with torch.no_grad():  # the actor after its step, as the temperature's step saw it
        _, logp = learner.actor.squash(obs, alpha_noise)
    gap = float((logp + learner.target_entropy).mean())
    step = learner.log_alpha.item() - math.log(0.05)
    assert step == pytest.approx(gap * (0.05 if temperature_loss == "alpha" else 1.0), rel=1e-4)
