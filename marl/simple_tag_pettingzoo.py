"""A PettingZoo ``ParallelEnv`` over one environment of the batched simple tag (what
``parallel_api_test`` and mpe2-style code see)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from gymnasium import spaces
from pettingzoo import ParallelEnv
from torch import Tensor

from marl.action_checks import box_action, check_agent_names, discrete_action
from marl.simple_tag import SimpleTag, SimpleTagConfig

__all__ = ["SimpleTagParallelEnv"]


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
