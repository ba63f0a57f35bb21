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

### Arguments

``SimpleTag(num_envs, config=None, *, device="cpu", **overrides)`` where the
overrides are fields of :class:`SimpleTagConfig`: ``num_good=1``,
``num_adversaries=3``, ``num_obstacles=2``, ``max_cycles=25``,
``continuous_actions=False``, ``num_agent_neighbors=None``,
``num_landmark_neighbors=None``, ``terminate_on_success=False``,
``auto_reset=True``, ``dtype=torch.float32``, ``neighbor_method="auto"``,
``compile=False``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor

from marl._simple_tag_config import SimpleTagConfig, SimpleTagState
from marl._simple_tag_kernels import (
    PassResult,
    TagConstants,
    action_force,
    dense_pass,
    integrate,
    rewards,
)
from marl._simple_tag_obs import make_layout, observe

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
        self.team = torch.cat(
            (torch.zeros(na, dtype=torch.long), torch.ones(ng, dtype=torch.long))
        ).to(dev)
        good = self.team.bool()

        def per_team(adversary: float, good_agent: float) -> Tensor:
            return torch.tensor([adversary] * na + [good_agent] * ng, dtype=dt, device=dev)

        size = per_team(0.075, 0.05)
        ent_size = torch.cat((size, torch.full((nl,), 0.2, dtype=dt, device=dev)))
        self.constants = TagConstants(
            num_agents=a,
            num_landmarks=nl,
            accel=per_team(3.0, 4.0),
            max_speed=per_team(1.0, 1.3),
            size=size,
            is_good=good,
            dist_min=size[:, None] + ent_size[None, :],
            opposite=good[:, None] ^ good[None, :],
        )
        k, kl = cfg.num_agent_neighbors, cfg.num_landmark_neighbors
        self.layout = make_layout(na, ng, nl, k, kl, dev)
        self.obs_dims = self.layout.obs_dims
        self.obs_dim = self.layout.obs_dim
        self.state_dim = int(self.obs_dims.sum())
        mask = torch.arange(self.obs_dim, device=dev)[None, :] < self.obs_dims[:, None]
        self._state_mask = None if bool(mask.all()) else mask.reshape(-1)
        method = cfg.neighbor_method
        if method == "auto":
            method = "dense" if a <= cfg.grid_threshold else "grid"
        self.neighbor_method = method
        self._pass_fn = self._make_pass(method)
        self._ent = torch.zeros(num_envs, a + nl, 2, dtype=dt, device=dev)
        self._vel_ext = torch.zeros(num_envs, a + 1, 2, dtype=dt, device=dev)
        self._steps = torch.zeros(num_envs, dtype=torch.long, device=dev)
        self._gen = torch.Generator(device=dev)
        self._gen.seed()
        self._res: PassResult | None = None
        self._obs: Tensor | None = None

    # ------------------------------------------------------------------ setup
    def _make_pass(self, method: str) -> Callable[[Tensor], PassResult]:
        c, lay, cfg = self.constants, self.layout, self.config
        k = lay.k_eff if lay.k is not None else None
        kl = lay.kl_eff if lay.kl is not None else None
        if method == "dense":

            def fn(ent: Tensor) -> PassResult:
                return dense_pass(ent, c, k, kl, cfg.chunk_elems)

        else:
            from marl._simple_tag_grid import grid_pass

            def fn(ent: Tensor) -> PassResult:
                return grid_pass(ent, c, k, kl, cfg.chunk_elems)

        if cfg.compile:
            return torch.compile(fn, dynamic=True)
        return fn

    # ------------------------------------------------------------- properties
    @property
    def agent_pos(self) -> Tensor:
        """``[E, A, 2]`` view of the agent positions."""
        return self._ent[:, : self.num_agents]

    @property
    def agent_vel(self) -> Tensor:
        """``[E, A, 2]`` view of the agent velocities."""
        return self._vel_ext[:, : self.num_agents]

    @property
    def landmark_pos(self) -> Tensor:
        """``[E, L, 2]`` view of the obstacle positions."""
        return self._ent[:, self.num_agents :]

    @property
    def steps(self) -> Tensor:
        """``[E]`` steps taken in each environment's current episode."""
        return self._steps

    @property
    def continuous_actions(self) -> bool:
        """Whether actions are float ``[E, A, 5]`` rather than integer ``[E, A]``."""
        return self.config.continuous_actions

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
        ent = torch.cat((pos, lm * 1.8 - 0.9), dim=1)
        if rows is None:
            self._ent.copy_(ent)
            self._vel_ext.zero_()
            self._steps.zero_()
        else:
            self._ent[rows] = ent
            self._vel_ext[rows] = 0.0
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
            self._ent.copy_(torch.cat((s.agent_pos, s.landmark_pos), dim=1))
            self._vel_ext.zero_()
            self.agent_vel.copy_(s.agent_vel)
            self._steps.copy_(s.steps if s.steps is not None else torch.zeros_like(self._steps))
        self._res = self._pass_fn(self._ent)
        self._obs = observe(self._ent, self._vel_ext, self._res, self.constants, self.layout)
        return self._obs

    # ------------------------------------------------------------------- step
    def _check_actions(self, actions: Tensor) -> Tensor:
        if not isinstance(actions, Tensor):
            actions = torch.as_tensor(actions)
        e, a = self.num_envs, self.num_agents
        if self.config.continuous_actions:
            if actions.shape != (e, a, 5) or not actions.is_floating_point():
                raise ValueError(
                    f"actions must be a float tensor of shape [{e}, {a}, 5] for continuous "
                    f"actions, got {actions.dtype} {tuple(actions.shape)}"
                )
            return actions.to(device=self.device, dtype=self.config.dtype)
        if actions.shape != (e, a) or actions.is_floating_point() or actions.dtype == torch.bool:
            raise ValueError(
                f"actions must be an integer tensor of shape [{e}, {a}] with values 0..4, "
                f"got {actions.dtype} {tuple(actions.shape)}; pass continuous_actions=True "
                "for float actions"
            )
        actions = actions.to(device=self.device, dtype=torch.long)
        if bool(((actions < 0) | (actions > 4)).any()):
            raise ValueError("actions must lie in 0..4 (no-op, left, right, down, up)")
        return actions

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
        actions = self._check_actions(actions)
        c = self.constants
        force = action_force(actions, c, self.config.continuous_actions) + self._res.force
        integrate(self.agent_pos, self.agent_vel, force, c)
        self._steps += 1
        res = self._pass_fn(self._ent)
        self._res = res
        reward = rewards(self.agent_pos, res.caught, c)
        truncated = self._steps >= self.max_cycles
        if self.config.terminate_on_success:
            caught_all = ((res.caught > 0) | ~c.is_good).all(-1)
            terminated = caught_all & ~truncated
        else:
            terminated = torch.zeros_like(truncated)
        obs = observe(self._ent, self._vel_ext, res, c, self.layout)
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
        sub = self._pass_fn(self._ent[rows])
        res = self._res
        assert res is not None
        res.force[rows] = sub.force
        res.caught[rows] = sub.caught
        if res.agent_idx is not None and sub.agent_idx is not None:
            res.agent_idx[rows] = sub.agent_idx
        if res.landmark_idx is not None and sub.landmark_idx is not None:
            res.landmark_idx[rows] = sub.landmark_idx
        new = obs.clone()
        new[rows] = observe(self._ent[rows], self._vel_ext[rows], sub, self.constants,
                            self.layout)
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
