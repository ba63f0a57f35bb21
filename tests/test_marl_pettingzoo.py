"""Tests of the PettingZoo bridges of the MARL layer."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("pettingzoo")

from mpe2 import simple_spread_v3, simple_tag_v3  # noqa: E402
from pettingzoo.test import parallel_api_test  # noqa: E402

from marl.pettingzoo import PettingZooBatchEnv  # noqa: E402
from marl.simple_tag import SimpleTag  # noqa: E402
from marl.simple_tag_pettingzoo import SimpleTagParallelEnv  # noqa: E402

BATCHED_API = (
    "num_envs", "num_agents", "agent_names", "team", "team_names", "obs_dim", "obs_dims",
    "state_dim", "continuous_actions", "num_actions", "action_dim", "reset", "step",
    "global_state",
)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(),
        dict(continuous_actions=True),
        dict(num_good=2, num_adversaries=6, num_obstacles=3, num_agent_neighbors=3,
             num_landmark_neighbors=2),
    ],
    ids=["default", "continuous", "partial"],
)
def test_parallel_api(kwargs: dict) -> None:
    parallel_api_test(SimpleTagParallelEnv(**kwargs), num_cycles=60)


def test_parallel_env_matches_mpe2() -> None:
    ours = SimpleTagParallelEnv(dtype=torch.float64)
    ref = simple_tag_v3.parallel_env()
    ref.reset(seed=3)
    world = ref.aec_env.unwrapped.world
    state = {
        "agent_pos": np.array([a.state.p_pos for a in world.agents]),
        "agent_vel": np.zeros((4, 2)),
        "landmark_pos": np.array([m.state.p_pos for m in world.landmarks]),
    }
    obs, infos = ours.reset(options={"state": state})
    assert ours.agents == ref.agents and set(infos) == set(ours.agents)
    rng = np.random.default_rng(0)
    for _ in range(25):
        assert ours.agents == ref.agents
        actions = {a: int(rng.integers(0, 5)) for a in ref.agents}
        r_obs, r_rew, r_te, r_tr, _ = ref.step(actions)
        obs, rew, te, tr, _ = ours.step(actions)
        for a in r_obs:
            assert obs[a].dtype == np.float32 and obs[a].shape == r_obs[a].shape
            np.testing.assert_allclose(obs[a], r_obs[a], atol=1e-5)
            assert rew[a] == pytest.approx(r_rew[a], abs=1e-5)
        assert te == r_te and tr == r_tr
        np.testing.assert_allclose(ours.state(), ref.state(), atol=1e-5)
    assert ours.agents == [] and ref.agents == []
    with pytest.raises(RuntimeError, match="reset"):
        ours.step({})


def test_batch_adapter_over_simple_spread() -> None:
    env = PettingZooBatchEnv(lambda: simple_spread_v3.parallel_env(max_cycles=4), num_envs=3)
    for name in BATCHED_API:
        assert hasattr(env, name)
    refs = [simple_spread_v3.parallel_env(max_cycles=4) for _ in range(3)]
    obs = env.reset(seed=10)
    ref_obs = [r.reset(seed=10 + i)[0] for i, r in enumerate(refs)]
    assert obs.shape == (3, 3, 18) and env.obs_dims.tolist() == [18, 18, 18]
    assert env.team_names == ("agent",) and env.team.tolist() == [0, 0, 0]
    assert env.global_state().shape == (3, 54)
    for i in range(3):
        for j, name in enumerate(env.agent_names):
            np.testing.assert_array_equal(obs[i, j].numpy(), ref_obs[i][name])
    gen = torch.Generator().manual_seed(0)
    for t in range(4):
        acts = torch.randint(0, 5, (3, 3), generator=gen)
        obs, rew, term, trunc, info = env.step(acts)
        assert rew.shape == (3, 3) and term.shape == (3, 3) and trunc.shape == (3, 3)
        for i, r in enumerate(refs):
            r_obs, r_rew, *_ = r.step({n: int(acts[i, j]) for j, n in enumerate(env.agent_names)})
            expected = np.stack([r_obs[n] for n in env.agent_names])
            got = info["final_obs"][i] if t == 3 else obs[i]
            np.testing.assert_allclose(got.numpy(), expected)
            np.testing.assert_allclose(rew[i].numpy(), [r_rew[n] for n in env.agent_names])
    assert bool(trunc.all()) and info["reset_mask"].tolist() == [True] * 3
    assert not torch.equal(obs, info["final_obs"])  # auto-reset started new episodes
    with pytest.raises(ValueError, match="shape"):
        env.step(torch.zeros(3, 2, dtype=torch.long))


def test_batch_adapter_pads_mixed_observation_sizes_like_simple_tag() -> None:
    """Over mpe2's simple tag the adapter and our batched env agree in layout."""
    adapter = PettingZooBatchEnv(lambda: simple_tag_v3.parallel_env(), num_envs=2)
    ours = SimpleTag(2)
    obs = adapter.reset(seed=0)
    for name in BATCHED_API:
        assert hasattr(ours, name)
    assert obs.shape == ours.reset(seed=0).shape == (2, 4, 16)
    assert adapter.obs_dims.tolist() == ours.obs_dims.tolist() == [16, 16, 16, 14]
    assert adapter.team.tolist() == ours.team.tolist() == [0, 0, 0, 1]
    assert adapter.state_dim == ours.state_dim == 62
    assert torch.all(obs[:, 3, 14:] == 0)
    np.testing.assert_allclose(
        adapter.global_state()[0].numpy(), adapter.envs[0].state(), atol=1e-7
    )


def test_batch_adapter_continuous_actions() -> None:
    env = PettingZooBatchEnv(
        lambda: simple_spread_v3.parallel_env(continuous_actions=True), num_envs=2
    )
    assert env.continuous_actions and env.action_dim == 5
    env.reset(seed=0)
    obs, rew, *_ = env.step(torch.rand(2, 3, 5))
    assert obs.shape == (2, 3, 18) and rew.dtype == torch.float32
    with pytest.raises(ValueError, match="num_envs"):
        PettingZooBatchEnv(lambda: simple_spread_v3.parallel_env(), num_envs=0)


def _tag_view(**kwargs) -> SimpleTagParallelEnv:
    env = SimpleTagParallelEnv(**kwargs)
    env.reset(seed=0)
    return env


@pytest.mark.parametrize("actions,match", [
    ({"good_0": 1}, r"unknown agent\(s\) \['good_0'\]"),
    ({"adversary_0": 0, "adversary_1": 0, "adversary_2": 0}, r"no actions for \['agent_0'\]"),
    ({"adversary_0": 0, "adversary_1": 0, "adversary_2": 0, "agent_0": 2.7},
     r"agent 'agent_0': action 2.7 \(float\) is not an integer of Discrete\(5\)"),
    ({"adversary_0": 0, "adversary_1": 5, "adversary_2": 0, "agent_0": 0},
     r"agent 'adversary_1': action 5 is outside Discrete\(5\) \(0..4\)"),
    ({"adversary_0": -1, "adversary_1": 0, "adversary_2": 0, "agent_0": 0},
     r"agent 'adversary_0': action -1 is outside"),
    ({"adversary_0": True, "adversary_1": 0, "adversary_2": 0, "agent_0": 0},
     r"agent 'adversary_0': action True \(bool\) is not an integer"),
], ids=["unknown", "missing", "float", "above", "below", "bool"])
def test_parallel_view_refuses_bad_discrete_actions(actions, match):
    env = _tag_view()
    with pytest.raises(ValueError, match=match):
        env.step(actions)
    obs, *_ = env.step({a: np.int64(1) for a in env.agents})  # numpy integers are integers
    assert set(obs) == set(env.agents)


@pytest.mark.parametrize("value,match", [
    (np.full(5, np.nan), r"agent 'agent_0': action \[nan, .*not finite; expected Box"),
    (np.array([0.0, np.inf, 0.0, 0.0, 0.0]), "not finite"),
    (np.zeros(4), r"agent 'agent_0': action of shape \(4,\), expected Box\(0.0, 1.0, \(5,\)"),
    ("up", r"agent 'agent_0': action 'up' is not numeric"),
], ids=["nan", "inf", "shape", "text"])
def test_parallel_view_refuses_bad_continuous_actions(value, match):
    env = _tag_view(continuous_actions=True)
    actions = {a: np.zeros(5, np.float32) for a in env.agents}
    actions["agent_0"] = value
    with pytest.raises(ValueError, match=match):
        env.step(actions)
    obs, *_ = env.step({a: np.full(5, 0.5, np.float32) for a in env.agents})
    assert all(np.isfinite(o).all() for o in obs.values())


def test_batched_simple_tag_names_the_agent_at_fault():
    env = SimpleTag(3)
    env.reset(seed=0)
    bad = torch.zeros(3, 4, dtype=torch.long)
    bad[2, 1] = 9
    with pytest.raises(ValueError, match=r"actions\[2, 1\] \(agent 'adversary_1'\) = 9: outside "
                       r"Discrete\(5\)"):
        env.step(bad)
    cont = SimpleTag(3, continuous_actions=True)
    cont.reset(seed=0)
    nan = torch.zeros(3, 4, 5)
    nan[1, 3, 0] = float("inf")
    with pytest.raises(ValueError, match=r"actions\[1, 3\] \(agent 'agent_0'\).*not finite"):
        cont.step(nan)


def test_batch_adapter_checks_each_agents_own_space():
    from mpe2 import simple_speaker_listener_v4

    env = PettingZooBatchEnv(simple_speaker_listener_v4.parallel_env, num_envs=2)
    env.reset(seed=0)
    assert env.action_counts == (3, 5) and env.num_actions == 5
    ok = torch.tensor([[2, 4], [0, 0]])
    env.step(ok)  # the listener's 4 is inside its Discrete(5)
    with pytest.raises(ValueError, match=r"actions\[0, 0\] \(agent 'speaker_0'\) = 4: outside "
                       r"its action space Discrete\(3\) \(indices 0..2\)"):
        env.step(torch.tensor([[4, 4], [0, 0]]))
    with pytest.raises(ValueError, match="integers.*no rounding"):
        env.step(torch.tensor([[2.7, 1.0], [0.0, 0.0]]))
    cont = PettingZooBatchEnv(
        lambda: simple_spread_v3.parallel_env(continuous_actions=True), num_envs=2)
    cont.reset(seed=0)
    acts = torch.rand(2, 3, 5)
    acts[1, 2, 4] = float("nan")
    with pytest.raises(ValueError, match=r"actions\[1, 2\] \(agent 'agent_2'\).*Box"):
        cont.step(acts)
