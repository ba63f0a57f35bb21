"""SAC on Pendulum-v1: runs under ``single`` on a real cluster and improves on the random
policy; its trained policy module maps observations to bounded actions; a discrete env is
refused in one line."""

from __future__ import annotations

import csv
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from distributed import Client

from daskrl.algos.evaluation import evaluate_module
from daskrl.cluster.local import local_cluster
from daskrl.core.script import load_graph
from daskrl.distributions import get_distribution
from daskrl.runtime.driver import RunSettings, train

REPO = Path(__file__).resolve().parent.parent
GRAPH = load_graph(str(REPO / "graphs" / "sac.py"))

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def client() -> Iterator[Client]:
    cluster = local_cluster([{"CPU": 1}])
    c = Client(cluster)
    try:
        yield c
    finally:
        c.close()
        cluster.close()


class _Uniform(torch.nn.Module):
    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.rand(obs.shape[0], 1) * 4 - 2


def test_sac_improves_on_pendulum(client, tmp_path):
    config = GRAPH.Config(hidden=64, num_envs=2, num_steps=100, eval_episodes=5,
                          batch_size=64)
    algo = GRAPH.build(config)
    summary = train(client, algo, get_distribution("single"),
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
        learner.qf_target.q1[-1].bias.fill_(100.0)
        learner.qf_target.q2[-1].bias.fill_(-100.0)
        for q in (learner.qf_target.q1, learner.qf_target.q2):
            q[-1].weight.zero_()
    sample = {"obs": np.zeros((4, 3), np.float32), "actions": np.zeros((4, 1), np.float32),
              "rewards": np.ones(4, np.float32), "next_obs": np.zeros((4, 3), np.float32),
              "discounts": np.full(4, 0.5, np.float32)}
    learner.hyper = SACHyper(autotune=False, alpha=1e-8, q_lr=0.0, tau=1.0)
    for group in learner.q_optimizer.param_groups:
        group["lr"] = 0.0
    out = learner.gradient_step(sample)
    q1 = float(out["losses/qf1_values"])
    # loss = (q1 - target)^2 + (q2 - target)^2 with target = 1 + 0.5 * (-100) = -49
    q1v, q2v = learner.qf(torch.zeros(4, 3), torch.zeros(4, 1))
    expected = ((q1v + 49) ** 2).mean() + ((q2v + 49) ** 2).mean()
    assert out["losses/qf_loss"] == pytest.approx(float(expected), rel=1e-4), q1
