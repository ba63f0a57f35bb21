"""Reward parity of the batched simple tag with mpe2 on episodes built to exercise every
reward term: adversary-good collisions, and good agents crossing the boundary penalty's
linear band (0.9-1.0), its exponential part (1.0-2.15) and its cap of 10 (beyond 2.15).

Both teams' rewards (and the observations) are compared at every step; in float64 to 1e-6.
A mutation check below patches a wrong bound cap and a wrong collision reward into the
kernels and requires the same comparison to fail, so the episodes are known to reach the
terms they are meant to test.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from mpe2 import simple_tag_v3 as mpe2_tag  # the reference env (test extra)

import marl._simple_tag_kernels as kernels
import marl.simple_tag as simple_tag
from marl.simple_tag import SimpleTag, SimpleTagConfig

TEAMS = {"1g3a": (1, 3, 2), "4g4a": (4, 4, 2), "10g30a": (10, 30, 3)}
EPISODES = ("band", "beyond", "collide")


def build_state(kind: str, num_good: int, num_adv: int, num_obs: int, seed: int
                ) -> dict[str, np.ndarray]:
    """Initial positions and velocities for one constructed episode.

    ``band``: good agents start in 0.86-0.98 on x (and y for odd ones) moving outwards, so
    they cross the linear band and leave it; ``beyond``: they start at 1.7-2.4 moving
    outwards, across the exponential part and the cap at 2.15; ``collide``: every adversary
    starts touching a good agent and moving at it.
    """
    rng = np.random.default_rng(seed)
    pos = rng.uniform(-0.5, 0.5, (num_adv + num_good, 2))
    vel = np.zeros_like(pos)
    good = np.arange(num_adv, num_adv + num_good)
    frac = (np.arange(num_good) + 0.5) / num_good
    if kind in ("band", "beyond"):
        start = 0.84 + 0.12 * frac if kind == "band" else 1.7 + 0.7 * frac
        sign = np.where(np.arange(num_good) % 2 == 0, 1.0, -1.0)
        pos[good, 0] = sign * start
        pos[good, 1] = np.where(np.arange(num_good) % 2 == 1, -start, 0.2 * frac)
        speed = 0.1 if kind == "band" else 0.4
        vel[good, 0] = sign * speed
        vel[good, 1] = np.where(np.arange(num_good) % 2 == 1, -speed, 0.0)
    else:
        pos[good] = rng.uniform(-0.6, 0.6, (num_good, 2))
        for i in range(num_adv):
            g = good[i % num_good]
            angle = rng.uniform(0, 2 * np.pi)
            offset = 0.1 * np.array([np.cos(angle), np.sin(angle)])
            pos[i] = pos[g] + offset
            vel[i] = -offset * 5.0
    f32 = np.float32  # exact in float32, so both envs start from the very same numbers
    return {"agent_pos": pos.astype(f32).astype(np.float64),
            "agent_vel": vel.astype(f32).astype(np.float64),
            "landmark_pos": rng.uniform(-0.9, 0.9, (num_obs, 2)).astype(f32).astype(np.float64)}


def run_episode(teams: str, kind: str, dtype: torch.dtype, seed: int = 0
                ) -> tuple[float, float, dict[str, int]]:
    """One 25-step episode in both envs: the largest reward and observation errors, and how
    often each reward term was reached (from mpe2's own world)."""
    ng, na, nl = TEAMS[teams]
    state = build_state(kind, ng, na, nl, seed)
    ref = mpe2_tag.parallel_env(num_good=ng, num_adversaries=na, num_obstacles=nl,
                                max_cycles=25)
    ref.reset(seed=0)
    world = ref.aec_env.unwrapped.world
    for i, agent in enumerate(world.agents):
        agent.state.p_pos = state["agent_pos"][i].copy()
        agent.state.p_vel = state["agent_vel"][i].copy()
    for i, landmark in enumerate(world.landmarks):
        landmark.state.p_pos = state["landmark_pos"][i].copy()
    cfg = SimpleTagConfig(num_good=ng, num_adversaries=na, num_obstacles=nl, max_cycles=25)
    env = SimpleTag(1, cfg, dtype=dtype, auto_reset=False)
    env.reset(state=state)
    names = ref.possible_agents
    rng = np.random.default_rng(seed + 1)
    rew_err = obs_err = 0.0
    reached = {"collision": 0, "band": 0, "exp": 0, "cap": 0}
    for _ in range(25):
        act = rng.integers(0, 5, ng + na)
        if kind != "collide":  # good agents often head out (right / left, down)
            out = np.where(np.arange(ng) % 2 == 0, 2, 1)
            act[na:] = np.where(rng.random(ng) < (0.3 if kind == "band" else 0.8), out,
                                act[na:])
        r_obs, r_rew, *_ = ref.step({n: int(act[i]) for i, n in enumerate(names)})
        obs, rew, *_ = env.step(torch.as_tensor(act)[None])
        expect = np.array([r_rew[n] for n in names])
        rew_err = max(rew_err, float(np.abs(rew[0].double().numpy() - expect).max()))
        for i, n in enumerate(names):
            d = r_obs[n].shape[0]
            obs_err = max(obs_err, float(np.abs(obs[0, i, :d].double().numpy()
                                                - r_obs[n]).max()))
        reached["collision"] += int((expect[:na] > 0).any())
        x = np.abs(np.array([a.state.p_pos for a in world.agents[na:]]))
        reached["band"] += int(((x > 0.9) & (x < 1.0)).sum())
        reached["exp"] += int(((x >= 1.0) & (x < 1.0 + np.log(10) / 2)).sum())
        reached["cap"] += int((x >= 1.0 + np.log(10) / 2).sum())
    return rew_err, obs_err, reached


def assert_parity(teams: str, dtype: torch.dtype = torch.float64, tol: float = 1e-6) -> None:
    """Every constructed episode of ``teams`` agrees with mpe2 to ``tol`` and reaches the
    reward terms it is built for."""
    total = dict.fromkeys(("collision", "band", "exp", "cap"), 0)
    for kind in EPISODES:
        rew_err, obs_err, reached = run_episode(teams, kind, dtype)
        assert rew_err <= tol and obs_err <= tol, (teams, kind, rew_err, obs_err)
        total = {k: v + reached[k] for k, v in total.items()}
    assert min(total.values()) >= 3, (teams, total)  # every term reached (else the test is blind)


@pytest.mark.parametrize("teams", list(TEAMS))
def test_rewards_of_both_teams_match_mpe2_in_float64(teams):
    assert_parity(teams)


def _capped_at_5(pos: torch.Tensor) -> torch.Tensor:
    x = pos.abs()
    ramp = (x - 0.9).mul_(10.0).clamp_(min=0.0)
    b = torch.where(x < 1.0, ramp, torch.exp(2.0 * x - 2.0).clamp_(max=5.0))
    return b[..., 0] + b[..., 1]


def _adversaries_get_5(pos: torch.Tensor, caught: torch.Tensor, c: Any, na: int
                       ) -> torch.Tensor:
    rew = kernels.rewards(pos, caught, c, na)
    rew[:, :na] *= 0.5
    return rew


@pytest.mark.parametrize("target,mutant", [
    ("bound_penalty", _capped_at_5),
    ("rewards", _adversaries_get_5),
], ids=["bound-cap-5", "collision-reward-5"])
def test_parity_fails_on_a_wrong_reward_kernel(monkeypatch, target, mutant):
    module = kernels if target == "bound_penalty" else simple_tag
    monkeypatch.setattr(module, target, mutant)
    for teams in ("1g3a", "4g4a"):
        worst = max(run_episode(teams, kind, torch.float64)[0] for kind in EPISODES)
        assert worst > 0.1, (teams, worst)  # a reward differs, not merely the observations
        with pytest.raises(AssertionError, match="band|beyond|collide"):
            assert_parity(teams)
