"""MAPPO: fused team forward passes, central vs local critics, data-parallel replicas, learning."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
import torch

from daskrl import Resources
from daskrl.algos.gae import gae
from daskrl.core.script import load_graph
from daskrl.distributions import get_distribution
from daskrl.distributions.replica import ReplicaUpdate, digest, sync_rounds
from daskrl.runtime.driver import RunSettings, train
from marl.mappo import (
    EnvSpec,
    MAPPOActor,
    MAPPOHyper,
    MAPPOLearner,
    MAPPOModel,
    ModelSpec,
    RolloutSpec,
    TeamLayout,
    ValueNorm,
    advantages,
    evaluate_teams,
    gae_tensor,
    layout_of,
    task_gpu,
    train_inline,
)

ROOT = Path(__file__).resolve().parents[1]
TAG = EnvSpec("simple_tag", num_good=2, num_adversaries=3)


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _model(layout: TeamLayout, critic: str = "central", state: str = "concat") -> MAPPOModel:
    torch.manual_seed(0)
    return MAPPOModel(layout, ModelSpec(critic=critic, state=state))


@pytest.mark.parametrize("layout", [
    layout_of(TAG),  # teams of 3 and 2, the good agents' observations padded
    TeamLayout(("a", "b"), ((0, 2), (1, 3, 4)), (6, 4, 6, 4, 3), 5),  # interleaved teams
])
def test_fused_forward_equals_per_agent_forward(layout):
    model = _model(layout)
    obs = torch.randn(6, layout.num_agents, layout.obs_dim)
    actions = torch.randint(0, 5, (6, layout.num_agents))
    greedy, _ = model.act(obs, deterministic=True)
    for t, agents in enumerate(layout.agents):
        d = layout.team_obs_dim(t)
        fused = model.logits(obs, t).view(6, len(agents), -1)
        logp, _, values = model.evaluate(obs, actions, t)
        state = model.global_state(obs)
        for e in range(6):
            for j, i in enumerate(agents):
                own = obs[e, i, :d]
                one = model.actors[t](own)
                torch.testing.assert_close(fused[e, j], one, rtol=1e-5, atol=1e-6)
                assert greedy[e, i] == one.argmax()
                expect = torch.log_softmax(one, -1)[actions[e, i]]
                torch.testing.assert_close(logp.view(6, -1)[e, j], expect, rtol=1e-5, atol=1e-6)
                v = model.critics[t](torch.cat([state[e], own]))
                torch.testing.assert_close(values.view(6, -1)[e, j], v[0], rtol=1e-5, atol=1e-6)


def test_global_state_is_the_envs():
    for spec in (TAG, EnvSpec("simple_spread")):
        env = spec.make(3, seed=0)
        obs = env.reset(seed=0)
        state = _model(layout_of(spec)).global_state(obs)
        torch.testing.assert_close(state, env.global_state(obs).float())


@pytest.mark.parametrize("state", ["concat", "pooled"])
def test_central_critic_sees_other_agents_local_does_not(state):
    layout = layout_of(TAG)
    obs = torch.randn(4, layout.num_agents, layout.obs_dim)
    for critic, sees_others in (("central", True), ("local", False)):
        model = _model(layout, critic, state)
        x = obs.clone().requires_grad_(True)
        model.values(x, 0)[:, 0].sum().backward()  # first adversary's value
        own, others = x.grad[:, 0].abs().sum(), x.grad[:, 1:].abs().sum()
        assert own > 0
        assert (others > 0) == sees_others, (critic, float(others))


def test_gae_per_agent_matches_numpy():
    g = torch.Generator().manual_seed(0)
    r, v, nv = (torch.randn(7, 12, generator=g) for _ in range(3))
    done = torch.rand(7, 12, generator=g) < 0.2
    term = done & (torch.rand(7, 12, generator=g) < 0.5)
    ref = gae(r.numpy(), v.numpy(), nv.numpy(), term.numpy(), done.numpy(), 0.99, 0.95)
    got = advantages(r, v, nv, term, done, 0.99, 0.95)
    np.testing.assert_allclose(got[0].numpy(), ref[0], rtol=1e-6)
    twin = gae_tensor(r, v, nv, term, done, 0.99, 0.95)  # the path taken on a GPU
    np.testing.assert_allclose(twin[0].numpy(), ref[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(twin[1].numpy(), ref[1], rtol=1e-5, atol=1e-6)


def test_value_norm_round_trip():
    vn = ValueNorm()
    x = torch.tensor([3.0, 5.0, 10.0])
    vn.update(vn.batch_stats(x))
    mean, std = vn.mean_std()
    assert float(mean) == pytest.approx(6.0) and float(std) == pytest.approx(float(x.std(
        unbiased=False)))
    torch.testing.assert_close(vn.denormalize(vn.normalize(x)), x)
    assert "value_norms.0.running_mean" in _model(layout_of(TAG)).state_dict()


def test_simple_spread_through_the_adapter():
    spec = EnvSpec("simple_spread", max_cycles=5)
    actor = MAPPOActor(spec, ModelSpec(), RolloutSpec(bootstrap_truncated=True), 2, seed=0)
    batch = actor.rollout(5)
    assert batch["obs"].shape == (10, 3, 18) and batch["stats"]["agent_steps"] == 30
    assert len(batch["stats"]["team_returns"]["agent"]) == 2


def _replica_pair(avg: bool) -> list[str]:
    """Two data-parallel replicas updated on different rollouts, gradients averaged or not."""
    hp = MAPPOHyper(update_epochs=2, num_minibatches=2)
    layout = layout_of(TAG)
    learners = [MAPPOLearner(layout, ModelSpec(), hp, seed=0) for _ in range(2)]
    learners[1].load_state_dict(learners[0].state_dict())
    short = EnvSpec("simple_tag", max_cycles=8, num_good=2, num_adversaries=3)
    batches = [MAPPOActor(short, ModelSpec(), RolloutSpec(), 4, seed=s).rollout(8)
               for s in (1, 2)]
    if not avg:
        for learner, batch in zip(learners, batches, strict=True):
            learner.update([batch], 0.0)
        return [digest(learner.weights()) for learner in learners]
    updates = [ReplicaUpdate(lr, [b], 0.0) for lr, b in zip(learners, batches, strict=True)]
    flats = [u.start() for u in updates]
    rounds = 1
    while flats[0] is not None:
        mean = (flats[0] + flats[1]) / 2  # round 0: the value-target statistics, then gradients
        flats = [u.step(mean) for u in updates]
        rounds += 1
    assert flats[1] is None and rounds == sync_rounds(learners[0]) + 1
    outs = [u.finish() for u in updates]
    ret = [out["return_mean/adversary"] for out in outs]
    assert ret[0] == ret[1] and np.isfinite(ret[0])  # both replicas' episodes
    return [digest(learner.weights()) for learner in learners]


def test_data_parallel_gradient_averaging_keeps_replicas_identical():
    same = _replica_pair(avg=True)
    assert same[0] == same[1]  # weights and value normalisers, bit for bit
    apart = _replica_pair(avg=False)
    assert apart[0] != apart[1]


@pytest.mark.parametrize("name", ["data-parallel", "actors-learner", "single"])
def test_graph_runs_under_distributions(cluster_gpu_client, tmp_path, name):
    graph = load_graph(str(ROOT / "graphs" / "mappo.py"))
    algo = graph.build(graph.Config(num_envs=8, num_steps=10, num_actors=2, update_epochs=2,
                                    num_minibatches=2, eval_episodes=4))
    algo = algo.with_resources({"learner": Resources(cpu=1)})
    dist = get_distribution(name)
    settings = RunSettings(out=tmp_path, steps=2 * algo.steps_per_iteration,
                           progress=False, tensorboard=False)
    summary = train(cluster_gpu_client, algo, dist, settings)
    with open(tmp_path / "metrics.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 2
    assert {"return_mean/adversary", "return_mean/good", "agents", "agent_steps_per_s"} <= set(
        rows[0])
    assert {"eval_return_mean", "eval_return_mean/adversary"} <= set(summary)
    if name == "data-parallel":
        assert all(r["replicas_identical"] == "True" for r in rows)
        # where each replica's update went: 2 epochs x 2 minibatches + the statistics round
        assert {float(r["dp/rounds"]) for r in rows} == {5.0}
        assert all(float(r[f"dp/compute_cpu_s/r{k}"]) > 0 for r in rows for k in (0, 1))
    else:
        assert int(rows[0]["agents"]) == 2 * 8 * 4


def test_actors_see_the_gpu_resource_of_their_task(cluster_gpu_client):
    """``--device auto`` puts an actor on cuda when its task holds a GPU (and torch has one)."""
    with_gpu = cluster_gpu_client.submit(task_gpu, resources={"GPU": 1}, pure=False)
    without = cluster_gpu_client.submit(task_gpu, resources={"CPU": 1}, pure=False)
    assert with_gpu.result() == 1.0 and without.result() == 0.0


def test_short_run_beats_random_adversaries():
    """Adversaries trained 40 x 3200 env steps against a random good agent catch it more
    often than the untrained (uniform) adversaries, on 400 fresh episodes each."""
    random_good = RolloutSpec(random_teams=("good",))
    run = train_inline(EnvSpec(), iterations=40, num_envs=128, seed=0, rollout=random_good,
                       hp=MAPPOHyper(learning_rate=2e-3, update_epochs=5))
    untrained = MAPPOLearner(layout_of(EnvSpec()), ModelSpec(), MAPPOHyper(), seed=0)

    def score(learner: MAPPOLearner) -> float:
        out = evaluate_teams(EnvSpec(), ModelSpec(), learner.weights(), seed=7, episodes=400,
                             deterministic=False, random_teams=("good",))
        return out["eval_return_mean/adversary"]

    before, after = score(untrained), score(run.learner)
    assert 3.0 < before < 6.5  # uniform adversaries: about 4.4 per adversary per episode
    assert after > before + 3.0, (before, after)


def test_bad_settings_name_the_flag():
    with pytest.raises(ValueError, match="critic='joint'"):
        ModelSpec(critic="joint")
    with pytest.raises(ValueError, match="teams are"):
        graph = load_graph(str(ROOT / "graphs" / "mappo.py"))
        graph.build(graph.Config(random_teams="prey"))
    with pytest.raises(ValueError, match="num-minibatches"):
        MAPPOLearner(layout_of(TAG), ModelSpec(), MAPPOHyper(num_minibatches=64), 0).update(
            [MAPPOActor(TAG, ModelSpec(), RolloutSpec(), 2, 0).rollout(4)], 0.0)


@pytest.mark.parametrize("module", ["marl.mappo", "marl.mappo_model", "marl.mappo_env",
                                    "marl.mappo_rollout", "marl.mappo_learner",
                                    "marl.mappo_policy", "marl.team_layout", "marl.value_norm",
                                    "marl.activations"])
def test_docstring_examples_run(module):
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0


@pytest.mark.slow  # the compile takes 10-80 s on one core
def test_compiled_step_gives_the_eager_update():
    batch = MAPPOActor(TAG, ModelSpec(), RolloutSpec(), 16, seed=1)
    learners = [MAPPOLearner(layout_of(TAG), ModelSpec(),
                             MAPPOHyper(update_epochs=2, num_minibatches=2, compile=c), seed=0)
                for c in (False, True)]
    batch.set_weights(learners[0].weights(), 0)
    data = batch.rollout(25)
    metrics = [learner.update([data], 0.0) for learner in learners]
    for key in ("losses/policy_loss", "losses/value_loss", "losses/entropy"):
        assert metrics[1][key] == pytest.approx(metrics[0][key], rel=1e-5, abs=1e-6)
    for k, v in learners[0].weights().items():
        torch.testing.assert_close(learners[1].weights()[k], v, rtol=1e-4, atol=1e-5)
