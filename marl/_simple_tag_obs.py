"""Observation assembly for :class:`marl.simple_tag.SimpleTag`.

Layout of one agent's observation, as in ``mpe2.simple_tag_v3``::

    [self_vel (2), self_pos (2), obstacle_rel_pos (2 * L'),
     other_agent_rel_pos (2 * K), other_agent_vel (2 * V)]

* full observability of agents (``num_agent_neighbors=None``): ``K = A - 1``
  other agents in index order, and velocities of the *good* other agents only,
  so ``V = G`` for an adversary and ``G - 1`` for a good agent;
* partial observability (``num_agent_neighbors=k``): the ``k`` nearest other
  agents, closest first, and ``V = k`` velocity slots aligned with them, holding
  the velocity of good neighbours and zeros for adversaries; slots beyond the
  number of other agents are zeros;
* obstacles: all ``L`` in index order, or the ``kl`` nearest, closest first,
  zero-padded likewise.

Relative positions are ``p_other - p_self``. Observations shorter than the
widest one (good agents under full observability) are zero-padded at the end.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from marl._simple_tag_kernels import PassResult, TagConstants


@dataclass(frozen=True)
class ObsLayout:
    """Index tables and sizes of the observation layout.

    Attributes
    ----------
    k, kl : int or None
        Requested neighbour counts (``None``: full observability).
    k_eff, kl_eff : int
        Neighbours actually available (``min(k, A - 1)``, ``min(kl, L)``).
    others : Tensor
        ``[A, A - 1]`` indices of the other agents, in index order.
    good_others : Tensor
        ``[A, G]`` indices of the good other agents; ``A`` (a zero velocity row)
        pads the good agents' lists.
    obs_dims : Tensor
        ``[A]`` true observation length of each agent.
    obs_dim : int
        Padded observation length (the maximum of ``obs_dims``).
    """

    k: int | None
    kl: int | None
    k_eff: int
    kl_eff: int
    others: Tensor
    good_others: Tensor
    obs_dims: Tensor
    obs_dim: int


def make_layout(
    num_adversaries: int,
    num_good: int,
    num_obstacles: int,
    k: int | None,
    kl: int | None,
    device: torch.device,
) -> ObsLayout:
    """Build the :class:`ObsLayout` of a world with the given team sizes."""
    a = num_adversaries + num_good
    idx = torch.arange(a)
    others = torch.stack([torch.cat((idx[:i], idx[i + 1 :])) for i in range(a)])
    good = list(range(num_adversaries, a))
    rows = []
    for i in range(a):
        g = [j for j in good if j != i]
        rows.append(g + [a] * (num_good - len(g)))
    good_others = torch.tensor(rows, dtype=torch.long).reshape(a, num_good)
    n_lm = num_obstacles if kl is None else kl
    if k is None:
        dims = [4 + 2 * n_lm + 2 * (a - 1) + 2 * (num_good - (i >= num_adversaries))
                for i in range(a)]
    else:
        dims = [4 + 2 * n_lm + 4 * k] * a
    obs_dims = torch.tensor(dims, dtype=torch.long)
    return ObsLayout(
        k=k,
        kl=kl,
        k_eff=a - 1 if k is None else min(k, a - 1),
        kl_eff=num_obstacles if kl is None else min(kl, num_obstacles),
        others=others.to(device),
        good_others=good_others.to(device),
        obs_dims=obs_dims.to(device),
        obs_dim=int(max(dims)),
    )


def _gather_rows(src: Tensor, idx: Tensor) -> Tensor:
    """``out[e, a, j] = src[e, idx[e, a, j]]`` for ``src`` of shape [E, R, 2]."""
    e, r, _ = src.shape
    base = torch.arange(e, device=src.device).mul_(r).view(e, 1, 1)
    return src.reshape(e * r, 2)[idx + base]


def _pad(x: Tensor, slots: int) -> Tensor:
    """Flatten ``[E, A, s, 2]`` to ``[E, A, 2 * slots]``, zero-padding missing slots."""
    e, a, s, _ = x.shape
    flat = x.reshape(e, a, 2 * s)
    if s == slots:
        return flat
    return torch.cat((flat, flat.new_zeros(e, a, 2 * (slots - s))), dim=-1)


def observe(
    pos: Tensor, vel: Tensor, lm: Tensor, res: PassResult, c: TagConstants, lay: ObsLayout
) -> Tensor:
    """Assemble the padded observation tensor ``[E, A, obs_dim]`` by gathering.

    Parameters
    ----------
    pos, vel : Tensor
        ``[E, A, 2]`` agent positions and velocities.
    lm : Tensor
        ``[E, L, 2]`` obstacle positions.
    res : PassResult
        Pairwise pass on ``pos`` (neighbour indices under partial observability).
    c : TagConstants
        World constants.
    lay : ObsLayout
        Observation layout.

    Returns
    -------
    Tensor
        Observations; the tail beyond ``lay.obs_dims[a]`` is zero.
    """
    a = c.num_agents
    e = pos.shape[0]
    me = pos.unsqueeze(2)
    if lay.kl is None:
        rel_lm = lm.unsqueeze(1) - me
    elif lay.kl_eff > 0 and res.landmark_idx is not None:
        rel_lm = _gather_rows(lm, res.landmark_idx) - me
    else:
        rel_lm = pos.new_zeros(e, a, 0, 2)
    parts = [vel, pos, _pad(rel_lm, c.num_landmarks if lay.kl is None else lay.kl)]
    if lay.k is None:
        rel = pos[:, lay.others.reshape(-1)].view(e, a, a - 1, 2) - me
        vel_ext = torch.cat((vel, vel.new_zeros(e, 1, 2)), dim=1)
        gv = vel_ext[:, lay.good_others.reshape(-1)]
        parts += [rel.reshape(e, a, -1), gv.reshape(e, a, -1)]
    else:
        if lay.k_eff > 0 and res.agent_idx is not None:
            idx = res.agent_idx
            rel = _gather_rows(pos, idx) - me
            nv = _gather_rows(vel, idx) * c.is_good[idx].unsqueeze(-1)
        else:
            rel = nv = pos.new_zeros(e, a, 0, 2)
        parts += [_pad(rel, lay.k), _pad(nv, lay.k)]
    return torch.cat(parts, dim=-1)
