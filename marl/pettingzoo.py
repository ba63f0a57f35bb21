"""PettingZoo bridges for the batched MARL interface.

* :class:`SimpleTagParallelEnv`: a PettingZoo ``ParallelEnv`` over one
  environment row of :class:`marl.simple_tag.SimpleTag` (per-agent numpy
  observations of each agent's true length, dict actions and rewards).
* :class:`PettingZooBatchEnv`: runs ``E`` copies of any PettingZoo parallel
  environment (e.g. ``mpe2.simple_spread_v3``) behind the batched interface of
  :class:`~marl.simple_tag.SimpleTag`.

The batched interface (used by trainers) is:

``reset(seed=None) -> obs``
    ``obs``: float ``[E, A, obs_dim]``, each agent's observation zero-padded to
    the widest one; ``obs_dims`` (``[A]``) holds the true lengths.
``step(actions) -> (obs, reward, terminated, truncated, info)``
    ``actions``: long ``[E, A]`` (discrete) or float ``[E, A, action_dim]``;
    ``reward`` ``[E, A]``; ``terminated``/``truncated`` bool ``[E, A]``.
    Finished environments are reset automatically; their last observation is in
    ``info["final_obs"]`` and ``info["reset_mask"]`` (``[E]``) marks them.
``global_state(obs=None) -> [E, state_dim]``
    All agents' unpadded observations concatenated, for a centralised critic.
Attributes
    ``num_envs``, ``num_agents``, ``agent_names``, ``team`` (long ``[A]``),
    ``team_names``, ``obs_dim``, ``obs_dims``, ``state_dim``,
    ``continuous_actions``, ``num_actions`` (discrete: the most of any agent) /
    ``action_dim``, ``action_counts`` (each agent's discrete actions).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from gymnasium import spaces
from pettingzoo import ParallelEnv
from torch import Tensor

from marl.simple_tag import SimpleTag, SimpleTagConfig

__all__ = ["PettingZooBatchEnv", "SimpleTagParallelEnv"]


class SimpleTagParallelEnv(ParallelEnv):
    """PettingZoo ``ParallelEnv`` over a single row of the batched simple tag.

    It owns a one-environment :class:`~marl.simple_tag.SimpleTag` (``batched``,
    without auto-reset) and converts its tensors to per-agent numpy arrays of
    each agent's true observation length. ``reset(options={"state": ...})``
    takes an explicit initial state.

    Parameters
    ----------
    config : SimpleTagConfig, optional
        World settings; keyword ``overrides`` replace individual fields.
    device : str or torch.device
        Device of the underlying batched state.
    **overrides
        Fields of :class:`~marl.simple_tag.SimpleTagConfig`.

    Examples
    --------
    >>> env = SimpleTagParallelEnv(num_good=1, num_adversaries=3)
    >>> obs, infos = env.reset(seed=0)
    >>> obs["agent_0"].shape, obs["adversary_0"].shape
    ((14,), (16,))
    >>> obs, rew, term, trunc, info = env.step({a: 0 for a in env.agents})
    """

    metadata = {"name": "marl_simple_tag_v0", "render_modes": [], "is_parallelizable": True}

    def __init__(
        self,
        config: SimpleTagConfig | None = None,
        *,
        device: str | torch.device = "cpu",
        **overrides: Any,
    ) -> None:
        overrides["auto_reset"] = False
        self.batched = SimpleTag(1, config, device=device, **overrides)
        b = self.batched
        self.possible_agents = list(b.agent_names)
        self.agents: list[str] = []
        self.render_mode = None
        dims = b.obs_dims.tolist()
        self.observation_spaces = {
            name: spaces.Box(-np.inf, np.inf, shape=(d,), dtype=np.float32)
            for name, d in zip(self.possible_agents, dims, strict=True)
        }
        if b.continuous_actions:
            act: spaces.Space = spaces.Box(0.0, 1.0, shape=(5,), dtype=np.float32)
        else:
            act = spaces.Discrete(5)
        self.action_spaces = {name: act for name in self.possible_agents}
        self.state_space = spaces.Box(-np.inf, np.inf, shape=(b.state_dim,), dtype=np.float32)
        self._dims = dims

    @property
    def max_cycles(self) -> int:
        """Episode length (settable)."""
        return self.batched.max_cycles

    @max_cycles.setter
    def max_cycles(self, value: int) -> None:
        self.batched.max_cycles = int(value)

    def observation_space(self, agent: str) -> spaces.Space:
        """Box of the agent's true observation length."""
        return self.observation_spaces[agent]

    def action_space(self, agent: str) -> spaces.Space:
        """``Discrete(5)`` or ``Box(0, 1, (5,))``."""
        return self.action_spaces[agent]

    def _obs_dict(self, obs: Tensor) -> dict[str, np.ndarray]:
        arr = obs[0].detach().cpu().numpy().astype(np.float32, copy=False)
        pairs = zip(self.possible_agents, self._dims, strict=True)
        return {n: arr[i, :d].copy() for i, (n, d) in enumerate(pairs)}

    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, np.ndarray], dict[str, dict[str, Any]]]:
        """Start an episode; ``options={"state": ...}`` injects an initial state."""
        state = (options or {}).get("state")
        obs = self.batched.reset(seed=seed, state=state)
        self.agents = self.possible_agents[:]
        return self._obs_dict(obs), {n: {} for n in self.agents}

    def step(self, actions: dict[str, Any]) -> tuple[
        dict[str, np.ndarray], dict[str, float], dict[str, bool], dict[str, bool],
        dict[str, dict[str, Any]],
    ]:
        """Step with one action per live agent.

        Raises
        ------
        ValueError
            For an unknown or missing agent, a discrete action that is not an integer in
            ``0..4``, or a continuous action that is not 5 finite numbers; the message names
            the agent and its action space (as mpe2 refuses them, rather than a silent
            no-op or NaN observations).
        """
        if not self.agents:
            raise RuntimeError("episode is over: call reset() before step()")
        b = self.batched
        check_agent_names(actions, self.agents)
        if b.continuous_actions:
            act = torch.zeros(1, b.num_agents, 5, dtype=b.config.dtype)
            for i, n in enumerate(self.possible_agents):
                act[0, i] = torch.from_numpy(box_action(n, actions[n], self.action_spaces[n]))
        else:
            act = torch.zeros(1, b.num_agents, dtype=torch.long)
            for i, n in enumerate(self.possible_agents):
                act[0, i] = discrete_action(n, actions[n], self.action_spaces[n])
        obs, rew, term, trunc, _ = b.step(act.to(b.device))
        names = self.agents
        r = rew[0].tolist()
        te, tr = bool(term[0, 0]), bool(trunc[0, 0])
        out = (
            self._obs_dict(obs),
            {n: float(r[i]) for i, n in enumerate(self.possible_agents)},
            {n: te for n in names},
            {n: tr for n in names},
            {n: {} for n in names},
        )
        if te or tr:
            self.agents = []
        return out

    def state(self) -> np.ndarray:
        """Concatenation of all agents' observations, as ``mpe2``'s ``state()``."""
        return self.batched.global_state()[0].detach().cpu().numpy().astype(np.float32)

    def render(self) -> None:
        """Rendering is not supported."""
        return None

    def close(self) -> None:
        """Nothing to release."""


def check_agent_names(actions: dict[str, Any], live: Sequence[str]) -> None:
    """Refuse an action dict whose agents are not exactly the live ones.

    Examples
    --------
    >>> check_agent_names({"good_0": 1}, ["agent_0"])
    Traceback (most recent call last):
    ...
    ValueError: actions for unknown agent(s) ['good_0'] and none for ['agent_0']: ...
    """
    if not isinstance(actions, dict):
        raise ValueError(f"actions must be a dict {{agent name: action}}, got "
                         f"{type(actions).__name__}")
    unknown = [n for n in actions if n not in live]
    missing = [n for n in live if n not in actions]
    if unknown or missing:
        what = [f"unknown agent(s) {unknown}" if unknown else "",
                f"none for {missing}" if missing else ""]
        raise ValueError(f"actions for {' and '.join(w for w in what if w)}: "
                         f"give one action for each live agent {list(live)}".replace(
                             "actions for none", "no actions"))


def discrete_action(name: str, action: Any, space: spaces.Discrete) -> int:
    """``action`` as an int, if it is an integer inside ``space``; else a ValueError naming
    ``name`` and the space.

    Examples
    --------
    >>> discrete_action("agent_0", np.int64(3), spaces.Discrete(5))
    3
    >>> discrete_action("agent_0", 2.7, spaces.Discrete(5))
    Traceback (most recent call last):
    ...
    ValueError: agent 'agent_0': action 2.7 (float) is not an integer of Discrete(5) (0..4)
    """
    value = action
    if isinstance(value, (np.ndarray, Tensor)) and value.ndim == 0:
        value = value.item() if not isinstance(value, np.ndarray) else value[()]
    integral = isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))
    hi = int(space.start) + int(space.n) - 1
    if not integral:
        raise ValueError(f"agent {name!r}: action {action!r} ({type(action).__name__}) is not "
                         f"an integer of {space} ({int(space.start)}..{hi})")
    if not space.contains(int(value)):
        raise ValueError(f"agent {name!r}: action {int(value)} is outside {space} "
                         f"({int(space.start)}..{hi})")
    return int(value)


def box_action(name: str, action: Any, space: spaces.Box) -> np.ndarray:
    """``action`` as a float array of ``space``'s shape and dtype, if it has that shape and
    finite values (out-of-range values are clipped by the env, as mpe2 does); else a
    ValueError naming ``name`` and the space.

    Examples
    --------
    >>> box_action("agent_0", [0.0, 1.0, 0.0, 0.0, 0.0], spaces.Box(0, 1, (5,))).shape
    (5,)
    >>> box_action("agent_0", [0.1, 0.2], spaces.Box(0, 1, (5,)))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: agent 'agent_0': action of shape (2,), expected Box(0.0, 1.0, (5,), float32)...
    """
    if isinstance(action, Tensor):
        action = action.detach().cpu().numpy()
    try:
        arr = np.asarray(action, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"agent {name!r}: action {action!r} is not numeric; expected "
                         f"{space}") from None
    if arr.shape != space.shape:
        raise ValueError(f"agent {name!r}: action of shape {arr.shape}, expected {space} "
                         f"(shape {space.shape})")
    if not np.isfinite(arr).all():
        raise ValueError(f"agent {name!r}: action {arr.tolist()} is not finite; expected "
                         f"{space}")
    return arr.astype(space.dtype)


def _default_team(name: str) -> str:
    return name.rsplit("_", 1)[0] if "_" in name else name


class PettingZooBatchEnv:
    """The batched MARL interface over ``E`` copies of a PettingZoo parallel env.

    Parameters
    ----------
    env_fn : callable
        Returns a new PettingZoo ``ParallelEnv`` (e.g.
        ``lambda: simple_spread_v3.parallel_env(max_cycles=25)``).
    num_envs : int
        Number of copies ``E``.
    device : str or torch.device
        Device of the returned tensors.
    team_of : callable, optional
        Maps an agent name to its team name; default: the name up to its last
        ``_`` (``"adversary_0" -> "adversary"``). Team ids follow first appearance.
    dtype : torch.dtype
        Dtype of observations and rewards.

    Examples
    --------
    >>> from mpe2 import simple_spread_v3
    >>> env = PettingZooBatchEnv(lambda: simple_spread_v3.parallel_env(), num_envs=2)
    >>> obs = env.reset(seed=0)
    >>> obs.shape
    torch.Size([2, 3, 18])
    >>> obs, rew, term, trunc, info = env.step(torch.zeros(2, 3, dtype=torch.long))
    """

    def __init__(
        self,
        env_fn: Callable[[], ParallelEnv],
        num_envs: int,
        *,
        device: str | torch.device = "cpu",
        team_of: Callable[[str], str] | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        if isinstance(num_envs, bool) or not isinstance(num_envs, int) or num_envs < 1:
            raise ValueError(f"num_envs must be a positive integer, got {num_envs!r}")
        if not callable(env_fn):
            raise ValueError("env_fn must be a callable returning a PettingZoo ParallelEnv")
        self.envs = [env_fn() for _ in range(num_envs)]
        first = self.envs[0]
        self.num_envs = num_envs
        self.device = torch.device(device)
        self.dtype = dtype
        self.agent_names: tuple[str, ...] = tuple(first.possible_agents)
        self.num_agents = len(self.agent_names)
        team_of = team_of or _default_team
        teams = [team_of(n) for n in self.agent_names]
        self.team_names: tuple[str, ...] = tuple(dict.fromkeys(teams))
        self.team = torch.tensor([self.team_names.index(t) for t in teams], device=self.device)
        dims = [int(np.prod(first.observation_space(n).shape)) for n in self.agent_names]
        self.obs_dims = torch.tensor(dims, device=self.device)
        self.obs_dim = max(dims)
        self.state_dim = sum(dims)
        self._dims = dims
        self._spaces = [first.action_space(n) for n in self.agent_names]
        self._check_action_spaces()
        self._counts = np.asarray(self.action_counts)
        mask = torch.arange(self.obs_dim)[None, :] < torch.tensor(dims)[:, None]
        self._state_mask = None if bool(mask.all()) else mask.reshape(-1).to(self.device)
        self._obs_np = np.zeros((num_envs, self.num_agents, self.obs_dim), dtype=np.float32)
        self._obs: Tensor | None = None

    def _check_action_spaces(self) -> None:
        sp = self._spaces
        if all(isinstance(s, spaces.Discrete) for s in sp):
            self.continuous_actions = False
            self.action_counts: tuple[int, ...] = tuple(int(s.n) for s in sp)
            self.num_actions = max(self.action_counts)
            self.action_dim = 1
        elif all(isinstance(s, spaces.Box) for s in sp):
            self.continuous_actions = True
            self.action_dim = max(int(np.prod(s.shape)) for s in sp)
            self.num_actions = self.action_dim
            self.action_counts = (self.action_dim,) * len(sp)
        else:
            raise ValueError(
                "PettingZooBatchEnv needs all agents to have Discrete or all Box action "
                f"spaces, got {[type(s).__name__ for s in sp]}"
            )

    def _write_obs(self, row: int, obs: dict[str, Any]) -> None:
        self._obs_np[row] = 0.0
        for i, n in enumerate(self.agent_names):
            if n in obs:
                self._obs_np[row, i, : self._dims[i]] = np.asarray(obs[n]).reshape(-1)

    def _obs_tensor(self) -> Tensor:
        return torch.from_numpy(self._obs_np.copy()).to(device=self.device, dtype=self.dtype)

    def reset(self, seed: int | None = None) -> Tensor:
        """Reset every copy (copy ``i`` gets ``seed + i``); returns ``[E, A, obs_dim]``."""
        for i, env in enumerate(self.envs):
            obs, _ = env.reset(seed=None if seed is None else seed + i)
            self._write_obs(i, obs)
        self._obs = self._obs_tensor()
        return self._obs

    def _env_actions(self, actions: np.ndarray, row: int, live: Sequence[str]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for i, n in enumerate(self.agent_names):
            if n not in live:
                continue
            if self.continuous_actions:
                d = int(np.prod(self._spaces[i].shape))
                out[n] = actions[row, i, :d].reshape(self._spaces[i].shape).astype(
                    self._spaces[i].dtype)
            else:
                out[n] = int(actions[row, i]) + int(self._spaces[i].start)
        return out

    def _check_actions(self, acts: np.ndarray) -> None:
        """Refuse non-integer or out-of-range discrete actions and NaN/inf continuous ones,
        naming the first (env, agent) at fault and its space."""
        if self.continuous_actions:
            if not np.issubdtype(acts.dtype, np.floating):
                raise ValueError(f"actions must be floats for continuous action spaces, got "
                                 f"{acts.dtype}")
            bad = ~np.isfinite(acts).all(-1)
        else:
            if not np.issubdtype(acts.dtype, np.integer):
                raise ValueError(f"actions must be integers for discrete action spaces, got "
                                 f"{acts.dtype}: pass a long tensor (no rounding is done)")
            bad = (acts < 0) | (acts >= self._counts[None, :])
        if bad.any():
            env, agent = (int(i) for i in np.argwhere(bad)[0])
            raise ValueError(
                f"actions[{env}, {agent}] (agent {self.agent_names[agent]!r}) = "
                f"{acts[env, agent].tolist()}: outside its action space "
                f"{self._spaces[agent]}" + ("" if self.continuous_actions else
                                             f" (indices 0..{self._counts[agent] - 1})"))

    def step(self, actions: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, dict[str, Any]]:
        """Step every copy; finished copies are reset (see the module docstring).

        Discrete actions are each agent's index into its own space (``0..n-1``); continuous
        ones fill each agent's first ``prod(shape)`` columns of ``action_dim``. Non-integer
        or out-of-range discrete actions and NaN/inf continuous ones raise a ValueError
        naming the agent and its space."""
        e, a = self.num_envs, self.num_agents
        want = (e, a, self.action_dim) if self.continuous_actions else (e, a)
        acts = actions.detach().cpu().numpy() if isinstance(actions, Tensor) else np.asarray(
            actions)
        if acts.shape != want:
            raise ValueError(f"actions must have shape {list(want)}, got {list(acts.shape)}")
        self._check_actions(acts)
        rew = np.zeros((e, a), dtype=np.float32)
        term = np.ones((e, a), dtype=bool)
        trunc = np.zeros((e, a), dtype=bool)
        done = np.zeros(e, dtype=bool)
        final = None
        for r, env in enumerate(self.envs):
            obs, rw, te, tr, _ = env.step(self._env_actions(acts, r, env.agents))
            self._write_obs(r, obs)
            for i, n in enumerate(self.agent_names):
                if n in rw:
                    rew[r, i] = rw[n]
                if n in te or n in tr:
                    term[r, i] = bool(te.get(n, False))
                    trunc[r, i] = bool(tr.get(n, False))
            done[r] = not env.agents
        if done.any():
            final = self._obs_tensor()
            for r in np.flatnonzero(done):
                obs, _ = self.envs[r].reset()
                self._write_obs(int(r), obs)
        self._obs = self._obs_tensor()
        info: dict[str, Any] = {}
        if final is not None:
            info["final_obs"] = final
            info["reset_mask"] = torch.from_numpy(done).to(self.device)

        def t(x: np.ndarray) -> Tensor:
            return torch.from_numpy(x).to(self.device)

        return self._obs, t(rew).to(self.dtype), t(term), t(trunc), info

    def global_state(self, obs: Tensor | None = None) -> Tensor:
        """Concatenated unpadded observations ``[E, state_dim]``."""
        if obs is None:
            if self._obs is None:
                raise RuntimeError("call reset() before global_state()")
            obs = self._obs
        flat = obs.reshape(*obs.shape[:-2], -1)
        return flat if self._state_mask is None else flat[..., self._state_mask]

    def close(self) -> None:
        """Close every copy."""
        for env in self.envs:
            env.close()
