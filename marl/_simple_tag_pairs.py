"""Small-team engine of :class:`marl.simple_tag.SimpleTag`: pair lists as matrices.

For a handful of agents per environment every quantity of a step is a linear
map of the flattened state followed by elementwise work on contiguous
``[E, P]`` tensors (``P`` unordered agent-agent and agent-obstacle pairs):

* relative positions of all pairs: ``X @ M`` with ``X = [pos | vel | obstacles]``
  flattened per environment;
* contact-force sums: ``(coef * dx) @ G`` with ``G`` in ``{-1, 0, +1}``;
* collision counts: ``touch @ H`` with ``H`` in ``{0, 1}``;
* full observations: ``X @ W``.

The matrices hold only ``-1``, ``0`` and ``+1`` and every output is a single
entry or the difference of two, so the products are exact (the same rounding as
a subtraction) whatever the summation order, provided float32 matrix products
run at full precision (``torch.get_float32_matmul_precision() == "highest"``,
the default).
"""

from __future__ import annotations

import warnings

import torch
from torch import Tensor
from torch.nn.functional import softplus

from marl._simple_tag_kernels import SOFTPLUS_FLOOR, PassResult, TagConstants
from marl._simple_tag_obs import ObsLayout


class PairEngine:
    """Pairwise pass and full observations for small teams via 0/±1 matrices.

    Parameters
    ----------
    c : TagConstants
        World constants.
    lay : ObsLayout
        Observation layout (full observations use :meth:`observe`).

    Examples
    --------
    >>> # built by marl.simple_tag.SimpleTag(neighbor_method="pairs")
    """

    def __init__(self, c: TagConstants, lay: ObsLayout) -> None:
        a, nl = c.num_agents, c.num_landmarks
        dev, dt = c.accel.device, c.accel.dtype
        if dev.type == "cuda" and dt == torch.float32 and torch.backends.cuda.matmul.allow_tf32:
            warnings.warn(
                "TF32 matmul is enabled (torch.backends.cuda.matmul.allow_tf32): relative "
                "positions lose precision; disable it, or use neighbor_method='dense'",
                stacklevel=3,
            )
        pairs = [(i, j) for i in range(a) for j in range(i + 1, a)]
        pairs += [(i, a + m) for i in range(a) for m in range(nl)]
        self.num_pairs = p = len(pairs)
        self.c, self.lay = c, lay
        mp = torch.zeros(2 * a, 2 * p, dtype=dt)  # columns: dx of each pair, then dy
        ml = torch.zeros(max(2 * nl, 1), 2 * p, dtype=dt)
        g = torch.zeros(p, a, dtype=dt)
        g2 = torch.zeros(2 * p, 2 * a, dtype=dt)  # (dx | dy) of pairs -> interleaved forces
        dmin = torch.zeros(p, dtype=dt)
        opp = []
        for col, (i, j) in enumerate(pairs):
            for ax in range(2):
                mp[2 * i + ax, ax * p + col] = -1.0
                if j < a:
                    mp[2 * j + ax, ax * p + col] = 1.0
                else:
                    ml[2 * (j - a) + ax, ax * p + col] = 1.0
            g[col, i] = -1.0
            for ax in range(2):
                g2[ax * p + col, 2 * i + ax] = -1.0
                if j < a:
                    g2[ax * p + col, 2 * j + ax] = 1.0
            if j < a:
                g[col, j] = 1.0
                if bool(c.is_good[i]) != bool(c.is_good[j]):
                    opp.append(col)
            dmin[col] = c.dist_min[i, j]
        # rows of the feature matrix X: [pos (2A) | vel (2A) | obstacles (2L)]
        self.m_pair = torch.cat((mp, torch.zeros(2 * a, 2 * p, dtype=dt), ml[: 2 * nl])).to(dev)
        self.g2t = g2.t().contiguous().to(dev)
        self.dmin_scaled = (dmin / c.contact_margin).to(dev)
        self.opp = torch.tensor(opp, dtype=torch.long, device=dev)
        self.opp_dmin = dmin[self.opp.cpu()].to(dev)
        self.h = g[self.opp.cpu()].abs().to(dev)
        # ordered (agent, other agent) -> pair column, for the nearest-k search
        col_of = {}
        for col, (i, j) in enumerate(pairs):
            col_of[(i, j)] = col_of[(j, i)] = col
        self.ordered = torch.tensor(
            [col_of[(i, int(o))] for i in range(a) for o in lay.others[i].tolist()],
            dtype=torch.long,
            device=dev,
        )
        self.lm_cols = slice(a * (a - 1) // 2, p)
        self.full_obs = lay.k is None and lay.kl is None
        if self.full_obs:
            self._build_obs_maps(dev, dt)

    def _build_obs_maps(self, dev: torch.device, dt: torch.dtype) -> None:
        c, lay = self.c, self.lay
        a, nl, d = c.num_agents, c.num_landmarks, lay.obs_dim
        wp = torch.zeros(2 * a, a * d, dtype=dt)
        wv = torch.zeros(2 * a, a * d, dtype=dt)
        wl = torch.zeros(max(2 * nl, 1), a * d, dtype=dt)
        for i in range(a):
            base = i * d
            for ax in range(2):
                wv[2 * i + ax, base + ax] = 1.0
                wp[2 * i + ax, base + 2 + ax] = 1.0
            col = base + 4
            if lay.kl is None:
                for m in range(nl):
                    for ax in range(2):
                        wl[2 * m + ax, col + ax] = 1.0
                        wp[2 * i + ax, col + ax] = -1.0
                    col += 2
            for o in lay.others[i].tolist():
                for ax in range(2):
                    wp[2 * o + ax, col + ax] = 1.0
                    wp[2 * i + ax, col + ax] = -1.0
                col += 2
            for o in lay.good_others[i].tolist():
                if o < a:
                    for ax in range(2):
                        wv[2 * o + ax, col + ax] = 1.0
                col += 2
        self.w_obs = torch.cat((wp, wv, wl[: 2 * nl])).to(dev)

    @staticmethod
    def features(pos: Tensor, vel: Tensor, lm: Tensor) -> Tensor:
        """Feature matrix ``X = [pos | vel | obstacles]`` of shape ``[E, 4A + 2L]``."""
        e = pos.shape[0]
        return torch.cat((pos.reshape(e, -1), vel.reshape(e, -1), lm.reshape(e, -1)), dim=1)

    def pass_(self, pos: Tensor, vel: Tensor, lm: Tensor) -> PassResult:
        """Pairwise pass for agent positions ``pos`` ``[E, A, 2]``.

        Returns forces, collision counts and, under partial observability, the
        nearest-neighbour indices (see :class:`~marl._simple_tag_kernels.PassResult`).
        """
        c, lay = self.c, self.lay
        e, a, _ = pos.shape
        p = self.num_pairs
        x = self.features(pos, vel, lm)
        dxy = x @ self.m_pair
        sq = dxy.square()
        dist = (sq[:, :p] + sq[:, p:]).sqrt_()
        z = torch.addcdiv(self.dmin_scaled, dist, dist.new_full((), -c.contact_margin))
        z.clamp_(min=SOFTPLUS_FLOOR)
        coef = softplus(z).mul_(c.contact_margin * c.contact_force).div_(dist)
        w = torch.cat((coef, coef), dim=1).mul_(dxy)
        force = (self.g2t @ w.t()).t().view(e, a, 2)
        touch = (dist.index_select(1, self.opp) < self.opp_dmin).to(pos.dtype)
        caught = (touch @ self.h).round_().long()
        agent_idx = landmark_idx = None
        if lay.k is not None and lay.k_eff > 0:
            d_ord = dist[:, self.ordered].view(e, a, a - 1)
            local = d_ord.topk(lay.k_eff, dim=-1, largest=False, sorted=True).indices
            agent_idx = lay.others[torch.arange(a, device=pos.device)[:, None], local]
        if lay.kl is not None and lay.kl_eff > 0:
            d_lm = dist[:, self.lm_cols].reshape(e, a, c.num_landmarks)
            landmark_idx = d_lm.topk(lay.kl_eff, dim=-1, largest=False, sorted=True).indices
        return PassResult(force, caught, agent_idx, landmark_idx, features=x)

    def observe(self, x: Tensor) -> Tensor:
        """Full observations ``[E, A, obs_dim]`` from the feature matrix ``x``."""
        return (x @ self.w_obs).view(x.shape[0], self.c.num_agents, self.lay.obs_dim)
