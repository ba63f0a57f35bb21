"""``graphs/ppo.py --vtrace`` on Box actions: the Gaussian head with PPO's running statistics,
V-trace fed the log-density of each step's whole action vector, against references written
out here."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from distributed import Client

from daskrl.algos import losses
from daskrl.algos.actor_critic import spaces_of
from daskrl.algos.networks import actor_critic_for
from daskrl.algos.normalize import Moments, Normalization
from daskrl.algos.ppo import PPOHyper
from daskrl.algos.vtrace import SequenceActor, VTraceLearner
from daskrl.core.script import load_graph

ROOT = Path(__file__).resolve().parents[1]
NORM = Normalization(obs=True, reward=True)


def _learner(env: str, seed: int = 0) -> VTraceLearner:
    """PPO's V-trace learner on ``env``'s head with running statistics that are not the
    identity (so a missing normalisation or reward scaling shows)."""
    spaces = spaces_of(env)
    learner = VTraceLearner(0, 0, seed, hp=PPOHyper(update_epochs=1, num_minibatches=1),
                            loss="ppo", network=partial(actor_critic_for, *spaces, (16, 16), NORM))
    rng = np.random.default_rng(seed)
    dim = spaces[0].shape[0]
    learner.net.obs_rms.update(Moments.of(rng.normal(0.5, 3.0, (50, dim))))
    learner.net.ret_rms.update(Moments.of(rng.normal(0.0, 4.0, (50,))))
    return learner


def _normalised(learner: VTraceLearner, obs: torch.Tensor) -> torch.Tensor:
    rms = learner.net.obs_rms
    return ((obs.double() - rms.mean) / torch.sqrt(rms.var + 1e-8)).clamp(-10, 10).float()


def _summed_logp(learner: VTraceLearner, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """log pi(a|s) of the whole action vector by torch.distributions, on normalised obs."""
    net = learner.net
    with torch.no_grad():
        mean = net.actor_mean(_normalised(learner, obs))
        normal = torch.distributions.Normal(mean, net.actor_logstd.expand_as(mean).exp())
        return normal.log_prob(actions).sum(-1)


def _pendulum_reward(obs: np.ndarray, action: np.ndarray) -> np.ndarray:
    """Pendulum-v1's reward of acting ``action`` on observation ``[cos, sin, theta_dot]``."""
    theta = np.arctan2(obs[..., 1], obs[..., 0])
    u = np.clip(action[..., 0], -2.0, 2.0)
    return -(theta**2 + 0.1 * obs[..., 2] ** 2 + 0.001 * u**2)


def test_on_policy_targets_are_the_plain_returns_of_the_scaled_rewards() -> None:
    gamma = 0.9
    learner = _learner("Pendulum-v1")
    actor = SequenceActor("Pendulum-v1", num_envs=2, seed=3, hidden=(16, 16), gamma=gamma,
                          normalization=NORM)
    actor.set_weights(learner.weights(), 0)
    batch = actor.rollout(205)  # Pendulum truncates at 200 steps: one reset step per env
    obs, actions, valid = batch["obs"], batch["actions"], batch["valid"]
    assert (~valid).sum() == 2 and batch["discounts"].min() == gamma  # truncated, never ended

    # rewards: Pendulum's own, divided by the return std that came with the weights
    std = np.sqrt(learner.net.ret_rms.var.item() + 1e-8)
    want_r = np.clip(_pendulum_reward(obs, actions) / std, -10, 10)
    np.testing.assert_allclose(batch["rewards"][valid], want_r[valid], rtol=1e-4, atol=1e-5)
    # moments: of the raw valid observations, for the learner to merge
    np.testing.assert_allclose(batch["moments"]["obs"].mean, obs[valid].astype(np.float64).mean(0),
                               rtol=1e-9)
    assert batch["moments"]["ret"].count == valid.sum() == batch["stats"]["env_steps"]

    (mb,) = learner.minibatches([batch], 0.0)
    # reference: on-policy V-trace targets are the discounted returns of the valid steps,
    # bootstrapped on the critic's value of the normalised next observation where a step is
    # followed by a reset step (its observation is the truncated episode's last)
    with torch.no_grad():
        v = learner.net.critic(_normalised(learner, torch.as_tensor(obs))).squeeze(-1).numpy()
        boot = learner.net.critic(_normalised(learner, torch.as_tensor(batch["last_obs"])))
    envs, steps = valid.shape
    want = np.zeros((envs, steps))
    for e in range(envs):
        g = float(boot[e])
        for t in range(steps - 1, -1, -1):
            nxt = g if t + 1 == steps or valid[e, t + 1] else v[e, t + 1]
            g = batch["rewards"][e, t] + batch["discounts"][e, t] * nxt
            want[e, t] = g
    np.testing.assert_allclose(np.sort(mb["returns"].numpy()), np.sort(want[valid]),
                               rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(np.sort(mb["values"].numpy()), np.sort(v[valid]), rtol=1e-4,
                               atol=1e-5)
    metrics = learner.finish_update([{}])
    assert abs(metrics["vtrace/rho_mean"] - 1.0) < 1e-4 and metrics["vtrace/rho_clipped"] == 0
    # the update merged what the actor saw into the statistics the next weights carry
    assert learner.net.obs_rms.count.item() == pytest.approx(50 + valid.sum() + 1e-4)


def test_behaviour_and_target_logp_are_summed_over_the_action_dimensions(monkeypatch: Any
                                                                          ) -> None:
    pytest.importorskip("mujoco")
    env = "Hopper-v5"  # three action dimensions: a sum differs from any one of them
    learner = _learner(env)
    actor = SequenceActor(env, num_envs=2, seed=0, hidden=(16, 16), normalization=NORM)
    actor.set_weights(learner.weights(), 0)
    batch = actor.rollout(6)
    assert batch["actions"].shape == (2, 6, 3) and batch["logp"].shape == (2, 6)
    obs = torch.from_numpy(batch["obs"]).reshape(12, -1)
    reference = _summed_logp(learner, obs, torch.from_numpy(batch["actions"]).reshape(12, 3))
    reference = reference.reshape(2, 6)
    torch.testing.assert_close(torch.from_numpy(batch["logp"]), reference, rtol=1e-5, atol=1e-5)

    seen: dict[str, torch.Tensor] = {}
    vtrace = losses.vtrace

    def spy(behaviour_logp: torch.Tensor, target_logp: torch.Tensor, *rest: Any) -> Any:
        seen.update(behaviour=behaviour_logp, target=target_logp)
        return vtrace(behaviour_logp, target_logp, *rest)

    monkeypatch.setattr(losses, "vtrace", spy)
    learner.minibatches([batch], 0.0)
    torch.testing.assert_close(seen["behaviour"], reference.T, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(seen["target"], reference.T, rtol=1e-5, atol=1e-5)

    # off-policy: the actor acted with older weights; the learner's log pi is the new one's
    stale = _learner(env, seed=1)
    actor.set_weights(stale.weights(), 1)
    batch = actor.rollout(6)
    learner.minibatches([batch], 0.0)
    obs = torch.from_numpy(batch["obs"]).reshape(12, -1)
    acts = torch.from_numpy(batch["actions"]).reshape(12, 3)
    torch.testing.assert_close(seen["behaviour"], _summed_logp(stale, obs, acts).reshape(2, 6).T,
                               rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(seen["target"], _summed_logp(learner, obs, acts).reshape(2, 6).T,
                               rtol=1e-5, atol=1e-5)


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}


def test_pendulum_trains_with_vtrace_under_stale_actors(tmp_path: Path) -> None:
    out = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "daskrl.cli", "train", "graphs/ppo.py", "--env", "Pendulum-v1",
         "--vtrace", "--distribution", "actors-learner:stale=1", "--num-envs", "2",
         "--num-steps", "32", "--update-epochs", "2", "--num-minibatches", "2", "--hidden",
         "16", "--steps", str(4 * 64), "--workers", "2", "--eval-episodes", "1",
         "--out", str(out)],
        capture_output=True, text=True, cwd=ROOT, env=_env(), timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    with (out / "metrics.csv").open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 4
    assert [r["policy_lag"] for r in rows] == ["0", "1", "1", "1"]
    assert abs(float(rows[0]["vtrace/rho_mean"]) - 1) < 1e-4  # the first batch: on-policy
    assert all(np.isfinite(float(r["vtrace/rho_mean"])) for r in rows)
    assert all(np.isfinite(float(r["losses/clipfrac"])) for r in rows)  # PPO's loss
    ckpt = sorted((out / "checkpoints").glob("ckpt-*.pt"))[-1]
    model = torch.load(ckpt, weights_only=False)["learner"]["model"]
    assert model["obs_rms.count"].item() == pytest.approx(4 * 64 + 1e-4)  # every step merged
    assert model["ret_rms.count"].item() == pytest.approx(4 * 64 + 1e-4)


def _refusal(ppo: Any, **config: Any) -> str:
    with pytest.raises(ValueError) as err:
        ppo.build(ppo.Config(vtrace=True, **config))
    line = str(err.value)
    assert "\n" not in line and "drop" in line, line
    return line


def test_the_refusals_that_remain_are_one_line() -> None:
    ppo = load_graph(str(ROOT / "graphs" / "ppo.py"))
    algo = ppo.build(ppo.Config(env="Pendulum-v1", vtrace=True))  # Box actions: served
    assert "vtrace" in algo.capabilities
    # discrete heads keep no running statistics (as before Box actions were served)
    assert "--normalize on" in _refusal(ppo, env="CartPole-v1", normalize="on")
    pytest.importorskip("envpool")
    assert "--env-backend envpool" in _refusal(ppo, env="Pendulum-v1", env_backend="envpool")
    pytest.importorskip("ale_py")
    line = _refusal(ppo, env="ALE/Breakout-v5")
    assert "--vtrace serves flat observations" in line and "(4, 84, 84)" in line


def _train(client: Client, spec: str, out: Path, deterministic: bool = True) -> dict[str, Any]:
    from daskrl.distributions import get_distribution
    from daskrl.runtime.driver import RunSettings, train

    ppo = load_graph(str(ROOT / "graphs" / "ppo.py"))
    algo = ppo.build(ppo.Config(env="Pendulum-v1", vtrace=True, num_actors=2, num_envs=2,
                                num_steps=16, update_epochs=2, num_minibatches=2, hidden=16))
    settings = RunSettings(out=out, steps=2 * algo.steps_per_iteration, seed=3, eval=False,
                           progress=False, tensorboard=False, deterministic=deterministic)
    summary = train(client, algo, get_distribution(spec), settings)
    model = torch.load(sorted((out / "checkpoints").glob("ckpt-*.pt"))[-1],
                       weights_only=False)["learner"]["model"]
    # every valid step of both iterations merged into the statistics the weights carry
    assert model["obs_rms.count"].item() == pytest.approx(summary["env_steps"] + 1e-4), spec
    return summary


@pytest.mark.timeout(300)
@pytest.mark.parametrize("spec", ["actors-learner", "single", "impala"])
def test_pendulum_vtrace_runs_under_the_distributions_that_serve_it(cluster_pair: dict[int, Client],
                                                                     tmp_path: Path,
                                                                     spec: str) -> None:
    _train(cluster_pair[2], spec, tmp_path, deterministic=spec != "impala")


@pytest.mark.timeout(300)
def test_vtrace_statistics_are_identical_on_one_and_two_workers(cluster_pair: dict[int, Client],
                                                                 tmp_path: Path) -> None:
    # data-parallel: the replicas average their moments before the V-trace update
    one = _train(cluster_pair[1], "data-parallel", tmp_path / "one")
    two = _train(cluster_pair[2], "data-parallel", tmp_path / "two")
    assert len(set(sum(two["placement"].values(), []))) == 2, two["placement"]
    assert one["weights_sha256"] == two["weights_sha256"]
