"""The trained MAPPO team actors as one exportable module (``make_policy``, ``daskrl eval``)."""

from __future__ import annotations

import copy

import torch
from torch import Tensor, nn

from .activations import swap_tanh
from .mappo_model import MAPPOModel

__all__ = ["MAPPOPolicy"]


class MAPPOPolicy(nn.Module):
    """The team actors alone: ``forward(obs) -> actions`` for every agent of a batch of envs.

    Observations are the batched env's layout, ``[B, A, obs_dim]`` (agent ``i`` in row ``i``,
    in the env's ``agent_names`` order, each zero-padded to the widest observation); the
    actions are ``[B, A]`` (int64, agent ``i``'s index into its own action space). Each team's
    actor sees its agents' first ``team_obs_dim`` columns. Teams in ``random_teams`` (not
    trained) act uniformly at random, in greedy mode too. No observation normalisation:
    MAPPO trains on raw observations.

    Examples
    --------
    >>> from marl.mappo_model import ModelSpec, TeamLayout
    >>> lay = TeamLayout(("adversary", "good"), ((0, 1, 2), (3,)), (16, 16, 16, 14), 5)
    >>> model = MAPPOModel(lay, ModelSpec())
    >>> pi = MAPPOPolicy(model, deterministic=True)
    >>> pi(torch.zeros(6, 4, 16)).shape
    torch.Size([6, 4])
    >>> torch.jit.script(pi)(torch.zeros(2, 4, 16)).dtype
    torch.int64
    """

    def __init__(self, model: MAPPOModel, deterministic: bool = True,
                 random_teams: frozenset[int] = frozenset()) -> None:
        super().__init__()
        lay = model.layout
        self.actors = nn.ModuleList([swap_tanh(copy.deepcopy(a), nn.Tanh) for a in model.actors])
        self.deterministic = deterministic
        self.num_agents = lay.num_agents
        self.register_buffer("order", torch.tensor([i for a in lay.agents for i in a]))
        self.starts = [sum(len(a) for a in lay.agents[:t]) for t in range(len(lay.names) + 1)]
        self.dims = [lay.team_obs_dim(t) for t in range(len(lay.names))]
        self.counts = [lay.team_num_actions(t) for t in range(len(lay.names))]
        self.random = [t in random_teams for t in range(len(lay.names))]

    def forward(self, obs: Tensor) -> Tensor:
        """Actions ``[B, A]`` for observations ``[B, A, obs_dim]``."""
        n = obs.shape[0]
        obs = obs.float()
        out = torch.zeros(n, self.num_agents, dtype=torch.long, device=obs.device)
        for t, actor in enumerate(self.actors):
            idx = self.order[self.starts[t] : self.starts[t + 1]]
            if self.random[t]:
                a = torch.randint(0, self.counts[t], (n, idx.shape[0]), device=obs.device)
            else:
                own = obs.index_select(1, idx)[:, :, : self.dims[t]]
                logits = actor(own.reshape(-1, self.dims[t]))
                if self.deterministic:
                    a = logits.argmax(-1)
                else:
                    a = torch.multinomial(torch.softmax(logits, -1), 1).squeeze(-1)
                a = a.view(n, -1)
            out[:, idx] = a
        return out
