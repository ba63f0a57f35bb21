"""Tests of the batched simple tag against the real ``mpe2.simple_tag_v3``."""

from __future__ import annotations

import zlib

import numpy as np
import pytest
import torch
from mpe2 import simple_tag_v3 as mpe2_tag  # the reference env (test extra)

from marl.simple_tag import SimpleTag, SimpleTagConfig, SimpleTagState


def random_state(rng: np.random.Generator, num_agents: int, num_obstacles: int) -> dict:
    """Random positions/velocities, representable exactly in float32."""

    def f32(x: np.ndarray) -> np.ndarray:
        return x.astype(np.float32).astype(np.float64)

    return {
        "agent_pos": f32(rng.uniform(-1.0, 1.0, (num_agents, 2))),
        "agent_vel": f32(rng.uniform(-0.6, 0.6, (num_agents, 2))),
        "landmark_pos": f32(rng.uniform(-0.9, 0.9, (num_obstacles, 2))),
    }


def mpe2_with_state(state: dict, **kwargs):
    """An ``mpe2`` parallel simple tag whose world is set to ``state``."""
    ref = mpe2_tag.parallel_env(**kwargs)
    ref.reset(seed=0)
    world = ref.aec_env.unwrapped.world
    for i, agent in enumerate(world.agents):
        agent.state.p_pos = state["agent_pos"][i].copy()
        agent.state.p_vel = state["agent_vel"][i].copy()
    for i, landmark in enumerate(world.landmarks):
        landmark.state.p_pos = state["landmark_pos"][i].copy()
    return ref


def assert_obs_match(ours: torch.Tensor, ref_obs: dict, env: SimpleTag, atol: float) -> None:
    for i, name in enumerate(env.agent_names):
        expected = ref_obs[name]
        dim = int(env.obs_dims[i])
        assert dim == expected.shape[0]
        np.testing.assert_allclose(ours[i, :dim].numpy(), expected, atol=atol, rtol=0)
        assert torch.all(ours[i, dim:] == 0)


PARITY_CASES = [
    pytest.param(dict(), id="default"),
    pytest.param(dict(continuous_actions=True), id="default-continuous"),
    pytest.param(dict(num_good=2, num_adversaries=6, num_obstacles=3), id="2g6a3o"),
    pytest.param(
        dict(num_good=2, num_adversaries=6, num_obstacles=3, continuous_actions=True),
        id="2g6a3o-continuous",
    ),
    pytest.param(
        dict(num_good=2, num_adversaries=6, num_obstacles=3, num_agent_neighbors=3,
             num_landmark_neighbors=2),
        id="partial-k3-kl2",
    ),
    pytest.param(
        dict(num_good=2, num_adversaries=6, num_obstacles=3, num_agent_neighbors=7,
             num_landmark_neighbors=3),
        id="partial-k-all",
    ),
    pytest.param(
        dict(num_good=1, num_adversaries=3, num_obstacles=2, num_agent_neighbors=5,
             num_landmark_neighbors=4),
        id="partial-padded",
    ),
    pytest.param(dict(num_good=3, num_adversaries=2, num_obstacles=0), id="no-obstacles"),
]


@pytest.mark.parametrize("kwargs", PARITY_CASES)
@pytest.mark.parametrize("method", ["pairs", "dense", "grid"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
def test_parity_with_mpe2(kwargs: dict, method: str, dtype: torch.dtype) -> None:
    """Same initial state and actions: obs, rewards, truncations agree for 25 steps."""
    # float64 runs agree to mpe2's own float32 output rounding (~1e-7). float32 runs
    # (the default dtype) carry float32 rounding that contacts amplify: over 40 random
    # 25-step episodes of 8 agents the largest error had a median of 2e-6, a maximum
    # of 1.6e-4.
    atol = 1e-5 if dtype == torch.float64 else 5e-4
    cfg = SimpleTagConfig(max_cycles=25, **kwargs)
    rng = np.random.default_rng(zlib.crc32(repr(sorted(kwargs.items())).encode()))
    state = random_state(rng, cfg.num_agents, cfg.num_obstacles)
    mpe_kwargs = {k: v for k, v in kwargs.items()}
    ref = mpe2_with_state(state, max_cycles=25, **mpe_kwargs)
    env = SimpleTag(1, cfg, dtype=dtype, neighbor_method=method, auto_reset=False)
    obs = env.reset(state=state)
    names = ref.possible_agents
    assert list(env.agent_names) == names
    assert_obs_match(obs[0], {n: ref.aec_env.observe(n) for n in names}, env, atol)
    np.testing.assert_allclose(env.global_state()[0].numpy(), ref.state(), atol=atol, rtol=0)
    for _ in range(25):
        if cfg.continuous_actions:
            act = rng.uniform(0.0, 1.0, (cfg.num_agents, 5)).astype(np.float32)
        else:
            act = rng.integers(0, 5, cfg.num_agents)
        r_obs, r_rew, r_term, r_trunc, _ = ref.step({n: act[i] for i, n in enumerate(names)})
        obs, rew, term, trunc, _ = env.step(torch.as_tensor(act)[None])
        assert_obs_match(obs[0], r_obs, env, atol)
        np.testing.assert_allclose(
            rew[0].numpy(), [r_rew[n] for n in names], atol=atol, rtol=1e-6
        )
        assert term[0].tolist() == [r_term[n] for n in names]
        assert trunc[0].tolist() == [r_trunc[n] for n in names]
        np.testing.assert_allclose(
            env.global_state()[0].numpy(), ref.state(), atol=atol, rtol=0
        )
    assert bool(trunc.all())


def brute_force_obs(state: SimpleTagState, env: SimpleTag, k: int, kl: int) -> np.ndarray:
    """Partial observations computed agent by agent with plain numpy."""
    pos = state.agent_pos.numpy()
    vel = state.agent_vel.numpy()
    lm = state.landmark_pos.numpy()
    good = env.team.numpy() == 1
    e, a, _ = pos.shape
    out = np.zeros((e, a, 4 + 2 * kl + 4 * k))
    for b in range(e):
        for i in range(a):
            row = [vel[b, i], pos[b, i]]
            d_lm = [np.linalg.norm(lm[b, m] - pos[b, i]) for m in range(lm.shape[1])]
            near_lm = sorted(range(lm.shape[1]), key=lambda m: d_lm[m])[:kl]
            row += [lm[b, m] - pos[b, i] for m in near_lm]
            row += [np.zeros(2)] * (kl - len(near_lm))
            others = [j for j in range(a) if j != i]
            d = {j: np.linalg.norm(pos[b, j] - pos[b, i]) for j in others}
            near = sorted(others, key=lambda j: d[j])[:k]
            row += [pos[b, j] - pos[b, i] for j in near] + [np.zeros(2)] * (k - len(near))
            row += [vel[b, j] if good[j] else np.zeros(2) for j in near]
            row += [np.zeros(2)] * (k - len(near))
            out[b, i] = np.concatenate(row)
    return out


@pytest.mark.parametrize("method", ["pairs", "dense", "grid"])
@pytest.mark.parametrize("k,kl", [(1, 1), (4, 2), (11, 3), (14, 6)])
def test_partial_observability_matches_brute_force(method: str, k: int, kl: int) -> None:
    env = SimpleTag(3, num_good=3, num_adversaries=9, num_obstacles=4, num_agent_neighbors=k,
                    num_landmark_neighbors=kl, dtype=torch.float64, neighbor_method=method)
    env.reset(seed=3)
    acts = torch.randint(0, 5, (3, 12), generator=torch.Generator().manual_seed(0))
    for _ in range(5):
        obs, *_ = env.step(acts)
        expected = brute_force_obs(env.get_state(), env, k, kl)
        np.testing.assert_allclose(obs.numpy(), expected, atol=1e-12)


def test_all_neighbours_is_a_reordering_of_full_observation() -> None:
    """With k = A - 1 the observed agents are the full set, ordered by distance."""
    kw = dict(num_good=2, num_adversaries=5, num_obstacles=3, dtype=torch.float64)
    full = SimpleTag(4, **kw)
    part = SimpleTag(4, num_agent_neighbors=6, num_landmark_neighbors=3, **kw)
    full.reset(seed=1)
    part.reset(state=full.get_state())
    acts = torch.randint(0, 5, (4, 7), generator=torch.Generator().manual_seed(2))
    obs_full, obs_part = full.step(acts)[0], part.step(acts)[0]
    for i in range(7):
        f = obs_full[:, i, : int(full.obs_dims[i])].numpy()
        p = obs_part[:, i].numpy()
        np.testing.assert_array_equal(f[:, :4], p[:, :4])
        for lo, hi, n in ((4, 10, 3), (10, 22, 6)):  # obstacles, other agents
            np.testing.assert_array_equal(
                np.sort(f[:, lo:hi].reshape(4, n, 2), axis=1),
                np.sort(p[:, lo:hi].reshape(4, n, 2), axis=1),
            )
        vel_f = f[:, 22:].reshape(4, -1, 2)
        vel_p = p[:, 22:].reshape(4, 6, 2)
        nonzero = np.abs(vel_p).sum(-1) > 0
        np.testing.assert_array_equal(
            np.sort(vel_f, axis=1), np.sort(vel_p[nonzero].reshape(4, -1, 2), axis=1)
        )


def test_batched_equals_one_by_one() -> None:
    cfg = SimpleTagConfig(num_good=2, num_adversaries=4, num_obstacles=2, max_cycles=8)
    batched = SimpleTag(5, cfg)
    batched.reset(seed=7)
    state = batched.get_state()
    singles = []
    for b in range(5):
        env = SimpleTag(1, cfg)
        env.reset(state={"agent_pos": state.agent_pos[b], "agent_vel": state.agent_vel[b],
                         "landmark_pos": state.landmark_pos[b]})
        singles.append(env)
    gen = torch.Generator().manual_seed(1)
    for _ in range(6):
        acts = torch.randint(0, 5, (5, 6), generator=gen)
        obs, rew, term, trunc, _ = batched.step(acts)
        for b, env in enumerate(singles):
            o, r, te, tr, _ = env.step(acts[b : b + 1])
            torch.testing.assert_close(obs[b], o[0], atol=1e-6, rtol=0)
            torch.testing.assert_close(rew[b], r[0], atol=1e-5, rtol=0)
            assert torch.equal(trunc[b], tr[0]) and torch.equal(term[b], te[0])


def test_auto_reset_only_resets_finished_rows() -> None:
    env = SimpleTag(4, max_cycles=10)
    ref = SimpleTag(4, max_cycles=10, auto_reset=False)
    env.reset(seed=0)
    state = env.get_state()
    state.steps = torch.tensor([9, 3, 9, 0])
    env.reset(state=state)
    ref.reset(state=state)
    acts = torch.randint(0, 5, (4, 4))
    obs, rew, term, trunc, info = env.step(acts)
    r_obs, r_rew, _, r_trunc, _ = ref.step(acts)
    assert trunc[:, 0].tolist() == [True, False, True, False]
    assert info["reset_mask"].tolist() == [True, False, True, False]
    torch.testing.assert_close(info["final_obs"], r_obs)
    torch.testing.assert_close(rew, r_rew)
    assert env.steps.tolist() == [0, 4, 0, 1]
    for b in (1, 3):  # untouched rows continue
        torch.testing.assert_close(obs[b], r_obs[b])
        torch.testing.assert_close(env.agent_pos[b], ref.agent_pos[b])
    for b in (0, 2):  # reset rows start afresh: at rest, inside the arena
        assert not torch.allclose(obs[b], r_obs[b])
        assert torch.all(env.agent_vel[b] == 0)
        assert torch.all(env.agent_pos[b].abs() <= 1)
        assert torch.all(env.landmark_pos[b].abs() <= 0.9)
    # the observation returned for reset rows is consistent with their new state
    fresh = SimpleTag(4, max_cycles=10)
    torch.testing.assert_close(fresh.reset(state=env.get_state()), obs)
    obs2, *_ = env.step(acts)  # the cached pass of reset rows is consistent too
    check = SimpleTag(4, max_cycles=10)
    check.reset(state=fresh.get_state())
    torch.testing.assert_close(check.step(acts)[0], obs2)


def test_terminate_on_success() -> None:
    env = SimpleTag(2, terminate_on_success=True)
    pos = torch.tensor([[0.0, 0.0], [0.5, 0.5], [-0.5, 0.5], [0.01, 0.0]])
    far = pos.clone()
    far[3] = torch.tensor([0.8, -0.8])
    env.reset(state={"agent_pos": torch.stack([pos, far]),
                     "landmark_pos": torch.tensor([[0.5, -0.5], [-0.5, -0.5]])})
    _, rew, term, trunc, info = env.step(torch.zeros(2, 4, dtype=torch.long))
    assert term[:, 0].tolist() == [True, False]
    assert not bool(trunc.any())
    assert rew[0].tolist() == [10.0, 10.0, 10.0, -10.0]
    assert info["reset_mask"].tolist() == [True, False]


def test_reset_seed_is_reproducible_and_in_range() -> None:
    a, b = SimpleTag(6), SimpleTag(6)
    torch.testing.assert_close(a.reset(seed=5), b.reset(seed=5))
    assert not torch.equal(a.reset(seed=6), b.reset(seed=5))
    assert a.agent_pos.abs().max() <= 1 and a.landmark_pos.abs().max() <= 0.9
    assert a.obs_dims.tolist() == [16, 16, 16, 14] and a.state_dim == 62
    assert a.team.tolist() == [0, 0, 0, 1] and a.team_names == ("adversary", "good")


@pytest.mark.parametrize("method", ["auto", "grid"])
def test_partial_observability_for_large_teams(method: str) -> None:
    env = SimpleTag(2, num_good=50, num_adversaries=150, num_obstacles=10,
                    num_agent_neighbors=6, num_landmark_neighbors=3, neighbor_method=method)
    assert env.neighbor_method == ("dense" if method == "auto" else "grid")
    obs = env.reset(seed=0)
    assert obs.shape == (2, 200, 4 + 6 + 24)
    obs, rew, *_ = env.step(torch.randint(0, 5, (2, 200)))
    assert torch.isfinite(obs).all() and rew.shape == (2, 200)
    assert env.global_state().shape == (2, 200 * 34)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
def test_grid_pass_equals_dense_pass(dtype: torch.dtype) -> None:
    """Large teams: the grid finds the same neighbours, contacts and forces."""
    from marl._simple_tag_grid import grid_pass
    from marl._simple_tag_kernels import dense_pass

    env = SimpleTag(2, num_good=150, num_adversaries=450, num_obstacles=8, dtype=dtype,
                    num_agent_neighbors=6, num_landmark_neighbors=3)
    env.reset(seed=4)
    pos = env.agent_pos.clone()
    pos[:, :150] *= 0.15  # a crowded core (many contacts) and a sparse rim
    pos[0, 599] = torch.tensor([3.0, -2.5], dtype=dtype)  # a far straggler
    c = env.constants
    dense = dense_pass(pos, env.landmark_pos, c, 6, 3)
    grid = grid_pass(pos, env.landmark_pos, c, 6, 3, chunk_elems=1 << 16)
    assert int(dense.caught.sum()) > 100
    assert torch.equal(dense.caught, grid.caught)
    assert torch.equal(dense.agent_idx, grid.agent_idx)
    assert torch.equal(dense.landmark_idx, grid.landmark_idx)
    scale = float(dense.force.abs().max())
    tol = 1e-12 if dtype == torch.float64 else 1e-6
    torch.testing.assert_close(grid.force, dense.force, atol=tol * scale, rtol=0)


def test_compiled_step_matches_eager() -> None:
    eager = SimpleTag(3, num_good=2, num_adversaries=4)
    compiled = SimpleTag(3, num_good=2, num_adversaries=4, compile=True)
    eager.reset(seed=2)
    compiled.reset(seed=2)
    acts = torch.randint(0, 5, (3, 6), generator=torch.Generator().manual_seed(0))
    for _ in range(3):
        a, b = eager.step(acts), compiled.step(acts)
        torch.testing.assert_close(a[0], b[0], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(a[1], b[1], atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(num_good=0), "num_good"),
        (dict(num_adversaries=-1), "num_adversaries"),
        (dict(num_agent_neighbors=0), "num_agent_neighbors"),
        (dict(num_landmark_neighbors=1.5), "num_landmark_neighbors"),
        (dict(max_cycles=0), "max_cycles"),
        (dict(neighbor_method="kd"), "neighbor_method"),
        (dict(dtype=torch.int32), "dtype"),
        (dict(num_goods=2), "unknown"),
    ],
)
def test_bad_arguments_raise(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        SimpleTag(2, **kwargs)


def test_bad_actions_and_state_raise() -> None:
    with pytest.raises(ValueError, match="num_envs"):
        SimpleTag(0)
    env = SimpleTag(2)
    env.reset(seed=0)
    with pytest.raises(ValueError, match="shape"):
        env.step(torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="0..4"):
        env.step(torch.full((2, 4), 5))
    with pytest.raises(ValueError, match="continuous_actions"):
        env.step(torch.zeros(2, 4))
    with pytest.raises(ValueError, match="agent_pos"):
        env.reset(state={"agent_pos": torch.zeros(3, 2), "landmark_pos": torch.zeros(2, 2)})
    with pytest.raises(ValueError, match="landmark_pos"):
        env.reset(state={"agent_pos": torch.zeros(4, 2)})
    cont = SimpleTag(2, continuous_actions=True)
    cont.reset(seed=0)
    with pytest.raises(ValueError, match="float"):
        cont.step(torch.zeros(2, 4, dtype=torch.long))
