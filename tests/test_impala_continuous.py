"""IMPALA with continuous actions: graphs/impala.py on Box action spaces, and V-trace fed the
log-density of each step's whole action vector (summed over its dimensions)."""

from __future__ import annotations

import csv
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from daskrl.algos import losses
from daskrl.algos.actor_critic import spaces_of
from daskrl.algos.networks import actor_critic_for
from daskrl.algos.ppo import PPOHyper
from daskrl.algos.vtrace import SequenceActor, VTraceLearner
from daskrl.core.script import load_graph
from daskrl.distributions import get_distribution
from daskrl.runtime.sync_backend import SyncBackend

ROOT = Path(__file__).resolve().parents[1]


def _summed_logp(net: Any, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """log pi(a|s) of the whole action vector, by torch.distributions (the reference)."""
    with torch.no_grad():
        mean = net.actor_mean(obs)
        normal = torch.distributions.Normal(mean, net.actor_logstd.expand_as(mean).exp())
        return normal.log_prob(actions).sum(-1)


def test_vtrace_gets_the_log_density_of_the_whole_action_vector(monkeypatch: Any) -> None:
    pytest.importorskip("mujoco")
    env = "Hopper-v5"  # three action dimensions: a sum differs from any one of them
    spaces = spaces_of(env)
    assert spaces[1].shape == (3,)
    actor = SequenceActor(env, num_envs=2, seed=0)
    learner = VTraceLearner(0, 0, seed=0, hp=PPOHyper(update_epochs=1, num_minibatches=1),
                            network=partial(actor_critic_for, *spaces, (64, 64)))
    actor.set_weights(learner.weights(), 0)
    batch = actor.rollout(6)
    assert batch["actions"].shape == (2, 6, 3) and batch["actions"].dtype == np.float32
    assert batch["logp"].shape == (2, 6)  # one log pi per env step
    obs = torch.from_numpy(batch["obs"]).reshape(12, -1)
    actions = torch.from_numpy(batch["actions"]).reshape(12, 3)
    reference = _summed_logp(learner.net, obs, actions).reshape(2, 6)
    torch.testing.assert_close(torch.from_numpy(batch["logp"]), reference, rtol=1e-5, atol=1e-5)

    seen: dict[str, torch.Tensor] = {}
    vtrace = losses.vtrace

    def spy(behaviour_logp: torch.Tensor, target_logp: torch.Tensor, *rest: Any) -> Any:
        seen.update(behaviour=behaviour_logp, target=target_logp)
        return vtrace(behaviour_logp, target_logp, *rest)

    monkeypatch.setattr(losses, "vtrace", spy)
    learner.minibatches([batch], 0.0)
    # time-major [steps, envs]: the actor's and the learner's summed log-densities
    torch.testing.assert_close(seen["behaviour"], reference.T, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(seen["target"], reference.T, rtol=1e-5, atol=1e-5)
    # on-policy: every importance weight is 1
    assert abs(learner.finish_update([{}])["vtrace/rho_mean"] - 1.0) < 1e-4


def test_impala_runs_pendulum(tmp_path: Path) -> None:
    from daskrl.runtime.driver import RunSettings, train

    impala = load_graph(str(ROOT / "graphs" / "impala.py"))
    algo = impala.build(impala.Config(env="Pendulum-v1", num_actors=2, num_envs=2,
                                      num_steps=16, eval_episodes=1))
    summary = train(SyncBackend(), algo, get_distribution("impala"),
                    RunSettings(out=tmp_path, steps=3 * 64, progress=False,
                                meta={"graph": "graphs/impala.py"}))
    with (tmp_path / "metrics.csv").open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert summary["iterations"] == 3 and len(rows) == 3
    assert all(r["policy_lags"] == "0:0 1:0" for r in rows)
    assert np.isfinite(float(rows[-1]["losses/value_loss"]))
    assert abs(float(rows[0]["vtrace/rho_mean"]) - 1) < 1e-4  # acting and learning agree
    assert np.isfinite(summary["eval_return_mean"])  # the Gaussian head's greedy policy
    # Box actions: running statistics on by default; every step the actors took is merged
    # into the statistics the final weights carry (the actors acted with the older ones)
    model = torch.load(sorted((tmp_path / "checkpoints").glob("ckpt-*.pt"))[-1],
                       weights_only=False)["learner"]["model"]
    assert model["obs_rms.count"].item() == pytest.approx(summary["env_steps"] + 1e-4)
    assert model["ret_rms.count"].item() == pytest.approx(summary["env_steps"] + 1e-4)
    policy = algo.make_policy(impala.make_learner(impala.Config(env="Pendulum-v1"), spaces_of(
        "Pendulum-v1"), 0, "cpu").weights(), True)
    assert policy(torch.zeros(5, 3)).shape == (5, 1)


def test_impala_normalisation_flag() -> None:
    impala = load_graph(str(ROOT / "graphs" / "impala.py"))
    with pytest.raises(ValueError, match="--normalize on serves Box actions"):
        impala.build(impala.Config(env="CartPole-v1", normalize="on"))
    raw = impala.build(impala.Config(env="Pendulum-v1", normalize="off"))
    spaces = spaces_of("Pendulum-v1")
    learner = raw.make_learner(0, "cpu")
    assert not any(k.startswith("obs_rms") for k in learner.weights())
    normed = impala.make_learner(impala.Config(env="Pendulum-v1"), spaces, 0, "cpu")
    assert "obs_rms.count" in normed.weights()
