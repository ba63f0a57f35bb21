"""Uniform-grid pairwise pass for large teams (work O(A) per environment).

Agents of each environment are binned into square cells of side ``h`` over the
environment's bounding box (all environments share one cell count ``G``). An
agent's candidates are the agents of its own and the 8 surrounding cells, held
in a padded ``[rows, 9 * M]`` table (``M``: the most agents in one cell), which
is processed in row chunks so memory stays O(E * A * k).

* Contact forces and collisions: ``h`` is at least the contact cut-off
  ``r_i + r_j + 25 * contact_margin``, so every pair closer than it is a
  candidate; pairs beyond it are skipped (each would add a force below
  ``1e-12``).
* Nearest neighbours: the ``k`` nearest candidates are exact when the k-th of
  them is no farther than the nearest edge of the searched 3x3 block (edges on
  the bounding box do not count); the remaining agents, rare when ``h`` is
  sized for the density, are solved by brute force over their environment.
* Obstacles are few: they are handled densely (``[E, A, L]``).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from marl._simple_tag_kernels import PassResult, TagConstants, contact_coefficient

CUTOFF_MARGINS = 25.0


def _landmarks(
    pos: Tensor, lm: Tensor, c: TagConstants, kl: int | None, chunk_elems: int
) -> tuple[Tensor, Tensor | None]:
    e, a, _ = pos.shape
    nl = lm.shape[1]
    if nl == 0:
        return torch.zeros_like(pos), None
    step = max(1, chunk_elems // (a * nl))
    forces, idxs = [], []
    dmin = c.dist_min[:, a:]
    for i in range(0, e, step):
        p, m = pos[i : i + step], lm[i : i + step]
        rel = m[:, None, :, :] - p[:, :, None, :]
        dist = rel.square().sum(-1).sqrt_()
        coef = contact_coefficient(dist, dmin, c)
        forces.append(-(coef.unsqueeze(-1) * rel).sum(2))
        if kl:
            idxs.append(dist.topk(kl, dim=-1, largest=False, sorted=True).indices)
    return torch.cat(forces), (torch.cat(idxs) if kl else None)


def _brute_knn(pos: Tensor, rows: Tensor, k: int, chunk_elems: int) -> Tensor:
    """Exact k nearest other agents of flat agent ``rows`` within their env."""
    e, a, _ = pos.shape
    out = []
    step = max(1, chunk_elems // a)
    for i in range(0, rows.numel(), step):
        r = rows[i : i + step]
        env, me = r // a, r % a
        d = (pos[env] - pos.reshape(-1, 2)[r][:, None, :]).square().sum(-1)
        d[torch.arange(r.numel(), device=r.device), me] = float("inf")
        out.append(d.topk(k, dim=-1, largest=False, sorted=True).indices)
    return torch.cat(out) if out else rows.new_zeros(0, k)


def grid_pass(
    pos: Tensor,
    lm: Tensor,
    c: TagConstants,
    k: int | None,
    kl: int | None,
    chunk_elems: int = 1 << 22,
) -> PassResult:
    """Pairwise pass with uniform-grid neighbour candidates.

    Parameters
    ----------
    pos, lm : Tensor
        ``[E, A, 2]`` agent and ``[E, L, 2]`` obstacle positions.
    c : TagConstants
        World constants.
    k, kl : int or None
        Nearest agents / obstacles to return (capped at what exists), or ``None``.
    chunk_elems : int
        Candidate slots processed at once (bounds temporary memory).

    Returns
    -------
    PassResult
        Same content as :func:`marl._simple_tag_kernels.dense_pass`.

    Examples
    --------
    >>> # used by marl.simple_tag.SimpleTag(neighbor_method="grid")
    """
    e, a, _ = pos.shape
    dev = pos.device
    force_l, lidx = _landmarks(pos, lm, c, kl, chunk_elems)
    rc = float(c.dist_min[:, :a].max()) + CUTOFF_MARGINS * c.contact_margin
    lo = pos.amin(1)  # [E, 2]
    extent = float((pos.amax(1) - lo).max()) + 1e-6
    h = rc
    if k:  # cells wide enough that the k nearest are usually in the 3x3 block
        sd = pos.std(1) if a > 1 else torch.ones_like(lo)
        area = 12.0 * float((sd[:, 0] * sd[:, 1]).mean())  # = 4 for uniform on [-1, 1]^2
        h = max(h, 1.5 * math.sqrt(k * area / (math.pi * a)))
    g = max(1, min(int(extent / h) + 1, int(math.sqrt(4 * a)) + 1))
    h = max(h, extent / g)
    cell = ((pos - lo[:, None, :]) / h).floor_().long().clamp_(0, g - 1)  # [E, A, 2]
    cx, cy = cell[..., 0].reshape(-1), cell[..., 1].reshape(-1)
    env_base = torch.arange(e, device=dev).repeat_interleave(a) * (g * g)
    key = env_base + cy * g + cx
    order = torch.argsort(key)
    counts = torch.bincount(key, minlength=e * g * g)
    starts = counts.cumsum(0) - counts
    m = int(counts.max())
    # everything below works on agents in cell order (q = position in that order)
    flat = pos.reshape(-1, 2)[order]
    px, py = flat[:, 0].contiguous(), flat[:, 1].contiguous()
    size = c.size.repeat(e)[order]
    good = c.is_good.repeat(e)[order]
    local = torch.arange(a, device=dev).repeat(e)[order]
    cx, cy, env_base = cx[order], cy[order], env_base[order]
    slot = torch.arange(m, device=dev)
    offs = torch.tensor([(ox, oy) for oy in (-1, 0, 1) for ox in (-1, 0, 1)], device=dev)
    n = e * a
    force = torch.empty(2, n, dtype=pos.dtype, device=dev)
    caught = torch.empty(n, dtype=torch.long, device=dev)
    kk = min(k, a - 1) if k else 0
    aidx = torch.empty(n, kk, dtype=torch.long, device=dev) if kk else None
    bad_rows = []
    step = max(1, chunk_elems // (9 * m))
    for i in range(0, n, step):
        q = torch.arange(i, min(i + step, n), device=dev)
        nx = cx[q, None] + offs[:, 0]  # [R, 9]
        ny = cy[q, None] + offs[:, 1]
        inside = (nx >= 0) & (nx < g) & (ny >= 0) & (ny < g)
        ncell = env_base[q, None] + ny.clamp(0, g - 1) * g + nx.clamp(0, g - 1)
        cnt = torch.where(inside, counts[ncell], 0)
        cand = (starts[ncell].unsqueeze(-1) + slot).clamp_(max=n - 1).view(q.numel(), 9 * m)
        valid = (slot < cnt.unsqueeze(-1)).view(q.numel(), 9 * m) & (cand != q[:, None])
        dx = px[cand] - px[q, None]
        dy = py[cand] - py[q, None]
        dist = (dx * dx + dy * dy).sqrt_().masked_fill_(~valid, float("inf"))
        dmin = size[q, None] + size[cand]
        coef = contact_coefficient(dist, dmin, c)
        force[0, q] = -(coef * dx).sum(1)
        force[1, q] = -(coef * dy).sum(1)
        opposite = good[q, None] ^ good[cand]
        caught[q] = ((dist < dmin) & opposite).sum(-1)
        if aidx is not None:
            top = dist.topk(kk, dim=-1, largest=False, sorted=True)
            aidx[q] = local[cand.gather(1, top.indices)]
            p = flat[q]
            c0 = torch.stack((cx[q], cy[q]), dim=-1).to(pos.dtype)
            base = lo[env_base[q] // (g * g)]
            inf = torch.full_like(p, float("inf"))
            left = torch.where(c0 > 0, p - (base + (c0 - 1) * h), inf)
            right = torch.where(c0 < g - 1, base + (c0 + 2) * h - p, inf)
            safe = torch.minimum(left, right).amin(-1)
            ok = (top.values[:, -1] <= safe) & torch.isfinite(top.values[:, -1])
            if not bool(ok.all()):
                bad_rows.append(q[~ok])
    rank = torch.empty_like(order)
    rank[order] = torch.arange(n, device=dev)
    if aidx is not None and bad_rows:
        rows = torch.cat(bad_rows)
        aidx[rows] = _brute_knn(pos, order[rows], kk, chunk_elems)
    return PassResult(
        force[:, rank].t().reshape(e, a, 2) + force_l,
        caught[rank].view(e, a),
        aidx[rank].view(e, a, kk) if aidx is not None else None,
        lidx,
    )
