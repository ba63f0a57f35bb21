"""PettingZoo bridges for the batched MARL interface.

* :class:`~marl.simple_tag_pettingzoo.SimpleTagParallelEnv` (in its own module,
  importable from here too): a PettingZoo ``ParallelEnv`` over one environment row of
  :class:`marl.simple_tag.SimpleTag` (per-agent numpy observations of each agent's true
  length, dict actions and rewards); its action checks are in :mod:`marl.action_checks`.
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

from marl.simple_tag_pettingzoo import SimpleTagParallelEnv

__all__ = ["PettingZooBatchEnv", "SimpleTagParallelEnv"]


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
