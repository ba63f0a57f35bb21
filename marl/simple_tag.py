"""
# Simple Tag (batched)

Predator-prey simple tag with every agent of every environment on a device in
one batched torch state: positions and velocities are ``[E, A, 2]`` tensors, a
step is a fixed number of tensor operations, never a Python loop over agents.
Semantics follow ``mpe2.simple_tag_v3`` exactly (checked step for step by the
test-suite).

| Import             | `from marl.simple_tag import SimpleTag`                        |
|--------------------|----------------------------------------------------------------|
| Actions            | Discrete (LongTensor [E, A], 0..4) / Continuous ([E, A, 5])     |
| Agents             | `adversary_0 .. adversary_{N-1}, agent_0 .. agent_{G-1}`        |
| Default agents     | 3 adversaries, 1 good agent, 2 obstacles                        |
| Action values      | Discrete(5) / Box(0.0, 1.0, (5,))                              |
| Observation        | Tensor [E, A, obs_dim], obs_dim = max over agents (14/16 -> 16) |
| Global state       | Tensor [E, sum(obs_dims)] (all agents' observations)           |
| Rewards            | Tensor [E, A]                                                  |
| Terminated/trunc.  | BoolTensor [E, A] (all agents of an env end together)          |

Good agents (prey, radius 0.05, accel 4.0, max speed 1.3) are rewarded -10 for
each adversary touching them; adversaries (radius 0.075, accel 3.0, max speed
1.0) all share +10 per (good agent, adversary) pair in collision. Obstacles
(radius 0.2) are fixed. Good agents also pay ``bound(|x|) + bound(|y|)`` with::

    bound(x) = 0 if x < 0.9 else 10 (x - 0.9) if x < 1 else min(exp(2x - 2), 10)

Physics (dt 0.1, unit mass): the action force (discrete 1..4: left, right, down,
up; continuous ``(a2 - a1, a4 - a3)``, times ``accel``) plus soft contact forces
``1e2 * (p_a - p_b) / d * 1e-3 * log(1 + exp((r_a + r_b - d) / 1e-3))`` between
all pairs; the position moves with the old velocity, then velocity is damped by
0.25, accelerated and capped at ``max_speed``. Agents start uniformly in
``[-1, 1]^2`` at rest, obstacles in ``[-0.9, 0.9]^2``. Episodes are truncated
after ``max_cycles`` steps.

Observation: ``[self_vel, self_pos, obstacle_rel_pos, other_agent_rel_pos,
other_agent_vel]``; with full observability other agents come in index order
and only good agents' velocities are seen, so a good agent's observation is two
entries shorter than an adversary's: it is zero-padded at the end, and
``env.obs_dims`` holds each agent's true length. With ``num_agent_neighbors=k``
(and/or ``num_landmark_neighbors``) only the ``k`` nearest are seen, closest
first, zero-padded when fewer exist; velocity slots hold good neighbours'
velocities and zeros for adversaries (``mpe2``'s partial observability). Large
teams need it: memory is then O(E * A * k).

Resets: ``reset(seed, state=None)`` draws new episodes (or takes explicit
positions/velocities); with ``auto_reset=True`` (default) ``step`` resets only
the environments that finished, returns their new first observation and puts
the last one in ``info["final_obs"]`` (``info["reset_mask"]`` marks them).

Exactness: in float64 observations and rewards equal ``mpe2``'s to its float32
output rounding (observations within 5e-7, rewards within 2e-9 on the constructed
collision and boundary episodes of ``tests/test_marl_parity.py``). In float32
(default) contacts amplify rounding with team size: on those episodes the largest
error was 3e-6 with 4 and 8 agents, but 2e-2 (observations) and 7e-3 (rewards) with
40 agents in contact-heavy episodes; use float64 where that matters. Contact forces
of pairs over 0.04 apart beyond touching are floored near 1e-17, and the grid
method skips pairs over 0.025 beyond touching (forces below 1.4e-12).

### Arguments

``SimpleTag(num_envs, config=None, *, device="cpu", **overrides)``, the
overrides being fields of :class:`SimpleTagConfig` (``num_good=1``,
``num_adversaries=3``, ``num_obstacles=2``, ``max_cycles=25``,
``continuous_actions=False``, ``num_agent_neighbors=None``,
``num_landmark_neighbors=None``, ``neighbor_method="auto"``, ``compile=False``...).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from marl._simple_tag_config import SimpleTagConfig, SimpleTagState
from marl._simple_tag_kernels import ActionMap, PassResult, TagConstants, integrate, rewards
from marl._simple_tag_obs import make_layout
from marl._simple_tag_passes import NeighbourPass

__all__ = ["SimpleTag", "SimpleTagConfig", "SimpleTagState"]

TEAM_NAMES = ("adversary", "good")


class SimpleTag:
    """Batched predator-prey simple tag over ``num_envs`` environments.

    Parameters
    ----------
    num_envs : int
        Number of environments ``E`` stepped together.
    config : SimpleTagConfig, optional
        World settings; keyword ``overrides`` replace individual fields.
    device : str or torch.device
        Where the state lives (``"cpu"``, ``"cuda"``...).
    **overrides
        Fields of :class:`SimpleTagConfig`, e.g. ``num_good=2``.

    Examples
    --------
    >>> env = SimpleTag(8, num_good=1, num_adversaries=3)
    >>> obs = env.reset(seed=0)
    >>> obs.shape
    torch.Size([8, 4, 16])
    >>> actions = torch.randint(0, 5, (8, 4))
    >>> obs, reward, terminated, truncated, info = env.step(actions)
    >>> reward.shape, env.global_state().shape
    (torch.Size([8, 4]), torch.Size([8, 62]))
    """

    num_actions: int = 5
    team_names: tuple[str, ...] = TEAM_NAMES

    def __init__(
        self,
        num_envs: int,
        config: SimpleTagConfig | None = None,
        *,
        device: str | torch.device = "cpu",
        **overrides: Any,
    ) -> None:
        if isinstance(num_envs, bool) or not isinstance(num_envs, int) or num_envs < 1:
            raise ValueError(f"num_envs must be a positive integer, got {num_envs!r}")
        cfg = (config or SimpleTagConfig()).replace(**overrides)
        self.config = cfg
        self.num_envs = num_envs
        self.device = torch.device(device)
        self.max_cycles = cfg.max_cycles
        dt, dev = cfg.dtype, self.device
        na, ng, nl = cfg.num_adversaries, cfg.num_good, cfg.num_obstacles
        a = na + ng
        self.num_agents = a
        self.num_landmarks = nl
        self.agent_names = tuple(
            [f"adversary_{i}" for i in range(na)] + [f"agent_{i}" for i in range(ng)]
        )
        self.constants = TagConstants.build(na, ng, nl, dt, dev)
        self.team = self.constants.is_good.long()
        k, kl = cfg.num_agent_neighbors, cfg.num_landmark_neighbors
        self.layout = make_layout(na, ng, nl, k, kl, dev)
        self.obs_dims = self.layout.obs_dims
        self.obs_dim = self.layout.obs_dim
        self.state_dim = int(self.obs_dims.sum())
        mask = torch.arange(self.obs_dim, device=dev)[None, :] < self.obs_dims[:, None]
        self._state_mask = None if bool(mask.all()) else mask.reshape(-1)
        self._passes = NeighbourPass(self.constants, self.layout, cfg)
        self.neighbor_method = self._passes.method
        self._pass_fn = self._passes.run
        self._actions = ActionMap(self.constants, num_envs, cfg.continuous_actions,
                                  self.agent_names)
        self._cap = self.constants.max_speed.expand(num_envs, a).contiguous()
        self._pos = torch.zeros(num_envs, a, 2, dtype=dt, device=dev)
        self._vel = torch.zeros(num_envs, a, 2, dtype=dt, device=dev)
        self._lm = torch.zeros(num_envs, nl, 2, dtype=dt, device=dev)
        self._steps = torch.zeros(num_envs, dtype=torch.long, device=dev)
        self._gen = torch.Generator(device=dev)
        self._gen.seed()
        self._res: PassResult | None = None
        self._obs: Tensor | None = None

    def _observe(self, pos: Tensor, vel: Tensor, lm: Tensor, res: PassResult) -> Tensor:
        return self._passes.observe(pos, vel, lm, res)

    # ------------------------------------------------------------- properties
    @property
    def agent_pos(self) -> Tensor:
        """``[E, A, 2]`` agent positions (the live tensor: do not modify)."""
        return self._pos

    @property
    def agent_vel(self) -> Tensor:
        """``[E, A, 2]`` agent velocities (the live tensor: do not modify)."""
        return self._vel

    @property
    def landmark_pos(self) -> Tensor:
        """``[E, L, 2]`` obstacle positions (the live tensor: do not modify)."""
        return self._lm

    @property
    def steps(self) -> Tensor:
        """``[E]`` steps taken in each environment's current episode."""
        return self._steps

    @property
    def continuous_actions(self) -> bool:
        """Whether actions are float ``[E, A, 5]`` rather than integer ``[E, A]``."""
        return self.config.continuous_actions

    @property
    def action_dim(self) -> int:
        """Length of one agent's action: 5 (continuous) or 1 (an integer in ``0..4``)."""
        return 5 if self.config.continuous_actions else 1

    @property
    def action_counts(self) -> tuple[int, ...]:
        """Discrete actions of each agent (5 for all)."""
        return (5,) * self.num_agents

    def get_state(self) -> SimpleTagState:
        """Return a copy of the physical state (positions, velocities, step counts).

        Examples
        --------
        >>> env = SimpleTag(2)
        >>> _ = env.reset(seed=1)
        >>> env.get_state().agent_pos.shape
        torch.Size([2, 4, 2])
        """
        return SimpleTagState(
            self.agent_pos.clone(),
            self.agent_vel.clone(),
            self.landmark_pos.clone(),
            self._steps.clone(),
        )

    # ------------------------------------------------------------------ reset
    def _randomize(self, rows: Tensor | None) -> None:
        n = self.num_envs if rows is None else int(rows.numel())
        a, dt, dev = self.num_agents, self.config.dtype, self.device
        pos = torch.rand(n, a, 2, generator=self._gen, dtype=dt, device=dev) * 2.0 - 1.0
        lm = torch.rand(n, self.num_landmarks, 2, generator=self._gen, dtype=dt, device=dev)
        lm = lm * 1.8 - 0.9
        if rows is None:
            self._pos.copy_(pos)
            self._lm.copy_(lm)
            self._vel.zero_()
            self._steps.zero_()
        else:
            self._pos[rows] = pos
            self._lm[rows] = lm
            self._vel[rows] = 0.0
            self._steps[rows] = 0

    def reset(
        self,
        seed: int | None = None,
        state: SimpleTagState | Mapping[str, Any] | None = None,
    ) -> Tensor:
        """Start new episodes in every environment.

        Parameters
        ----------
        seed : int, optional
            Seeds the generator used by this and later (auto-)resets.
        state : SimpleTagState or mapping, optional
            Explicit initial state: ``agent_pos`` ``[E, A, 2]``, optional
            ``agent_vel`` (default zeros), ``landmark_pos`` ``[E, L, 2]`` and
            ``steps`` ``[E]``; arrays without the env axis apply to all envs.

        Returns
        -------
        Tensor
            Observations ``[E, A, obs_dim]``.

        Examples
        --------
        >>> env = SimpleTag(4)
        >>> obs = env.reset(seed=0, state={"agent_pos": torch.zeros(4, 2),
        ...                                "landmark_pos": torch.ones(2, 2)})
        >>> obs.shape
        torch.Size([4, 4, 16])
        """
        if seed is not None:
            self._gen.manual_seed(int(seed))
        if state is None:
            self._randomize(None)
        else:
            s = SimpleTagState.coerce(
                state, self.num_envs, self.num_agents, self.num_landmarks,
                self.config.dtype, self.device,
            )
            self._pos.copy_(s.agent_pos)
            self._vel.copy_(s.agent_vel)
            self._lm.copy_(s.landmark_pos)
            self._steps.copy_(s.steps if s.steps is not None else torch.zeros_like(self._steps))
        self._res = self._pass_fn(self._pos, self._vel, self._lm)
        self._obs = self._observe(self._pos, self._vel, self._lm, self._res)
        return self._obs

    # ------------------------------------------------------------------- step
    def step(self, actions: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, dict[str, Any]]:
        """Advance every environment by one step.

        Parameters
        ----------
        actions : Tensor
            LongTensor ``[E, A]`` in ``0..4`` or, with continuous actions, float
            ``[E, A, 5]`` in ``[0, 1]`` (clipped).

        Returns
        -------
        obs : Tensor
            ``[E, A, obs_dim]``; for environments that finished and were
            auto-reset, the first observation of the new episode.
        reward : Tensor
            ``[E, A]`` rewards of this step.
        terminated, truncated : Tensor
            ``[E, A]`` bool.
        info : dict
            With auto-reset, when any env finished: ``"final_obs"`` (the
            ``[E, A, obs_dim]`` observation before the reset) and ``"reset_mask"``
            (``[E]`` bool, the environments that were reset).

        Examples
        --------
        >>> env = SimpleTag(2, continuous_actions=True)
        >>> _ = env.reset(seed=0)
        >>> obs, rew, term, trunc, info = env.step(torch.rand(2, 4, 5))
        >>> term.shape
        torch.Size([2, 4])
        """
        if self._res is None:
            raise RuntimeError("call reset() before step()")
        actions = self._actions.check(actions, self.device)
        c = self.constants
        force = self._actions(actions).add_(self._res.force)
        integrate(self._pos, self._vel, force, self._cap, c)
        self._steps += 1
        res = self._pass_fn(self._pos, self._vel, self._lm)
        self._res = res
        reward = rewards(self._pos, res.caught, c, self.config.num_adversaries)
        truncated = self._steps >= self.max_cycles
        if self.config.terminate_on_success:
            caught_all = ((res.caught > 0) | ~c.is_good).all(-1)
            terminated = caught_all & ~truncated
        else:
            terminated = torch.zeros_like(truncated)
        obs = self._observe(self._pos, self._vel, self._lm, res)
        info: dict[str, Any] = {}
        if self.config.auto_reset:
            done = terminated | truncated
            if bool(done.any()):
                obs = self._reset_rows(done, obs, info)
        self._obs = obs
        a = self.num_agents
        return (
            obs,
            reward,
            terminated[:, None].expand(-1, a),
            truncated[:, None].expand(-1, a),
            info,
        )

    def _reset_rows(self, done: Tensor, obs: Tensor, info: dict[str, Any]) -> Tensor:
        rows = done.nonzero().squeeze(1)
        info["final_obs"] = obs
        info["reset_mask"] = done
        self._randomize(rows)
        pos, vel, lm = self._pos[rows], self._vel[rows], self._lm[rows]
        sub = self._pass_fn(pos, vel, lm)
        assert self._res is not None
        self._res.assign_rows(rows, sub)
        new = obs.clone()
        new[rows] = self._observe(pos, vel, lm, sub)
        return new

    def global_state(self, obs: Tensor | None = None) -> Tensor:
        """Global state ``[E, state_dim]`` for a centralised critic.

        It is the concatenation of all agents' (unpadded) observations, in agent
        order, equal to ``mpe2``'s ``state()``.

        Parameters
        ----------
        obs : Tensor, optional
            Observations ``[..., A, obs_dim]`` to build the state from (e.g.
            ``info["final_obs"]``); defaults to the latest observations.

        Examples
        --------
        >>> env = SimpleTag(3)
        >>> _ = env.reset(seed=0)
        >>> env.global_state().shape
        torch.Size([3, 62])
        """
        if obs is None:
            if self._obs is None:
                raise RuntimeError("call reset() before global_state()")
            obs = self._obs
        flat = obs.reshape(*obs.shape[:-2], -1)
        if self._state_mask is None:
            return flat
        return flat[..., self._state_mask]
