"""Batched tensor kernels behind :class:`marl.simple_tag.SimpleTag`.

Everything here is a pure function of tensors, batch-first over environments,
so the same code runs on CPU and CUDA and can be wrapped by ``torch.compile``.

The central piece is the *pairwise pass*: from the positions of every entity it
computes, in one sweep over neighbouring pairs, the contact force on each agent,
the number of opposite-team agents each agent is touching (for rewards) and,
under partial observability, the indices of each agent's nearest neighbours.
A step needs the pass once: the pass run on the post-step positions serves the
rewards and observations of this step and the contact forces of the next one.

Two implementations of the pass exist: :func:`dense_pass` looks at all pairs of
an environment (best for small teams; memory bounded by chunking over
environments) and :mod:`marl._simple_tag_grid` bins agents into a uniform grid
(for large teams, work O(A) per environment instead of O(A^2)).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor
from torch.nn.functional import softplus


@dataclass(frozen=True)
class TagConstants:
    """Per-agent and per-pair constants of one simple-tag world.

    Attributes
    ----------
    num_agents, num_landmarks : int
        ``A`` agents first (adversaries, then good agents) and ``L`` obstacles.
    accel, max_speed, size : Tensor
        Per-agent ``[A]`` acceleration, speed cap and radius.
    is_good : Tensor
        ``[A]`` bool, ``True`` for good agents.
    dist_min : Tensor
        ``[A, A + L]`` sum of radii of each agent and each entity.
    opposite : Tensor
        ``[A, A]`` bool, ``True`` where one agent is an adversary and the other is good.
    """

    num_agents: int
    num_landmarks: int
    accel: Tensor
    max_speed: Tensor
    size: Tensor
    is_good: Tensor
    dist_min: Tensor
    opposite: Tensor
    contact_force: float = 1e2
    contact_margin: float = 1e-3
    damping: float = 0.25
    dt: float = 0.1


@dataclass
class PassResult:
    """Output of a pairwise pass, all batch-first over ``E`` environments.

    Attributes
    ----------
    force : Tensor
        ``[E, A, 2]`` sum of contact forces on each agent.
    caught : Tensor
        ``[E, A]`` number of opposite-team agents in collision with each agent.
    agent_idx : Tensor or None
        ``[E, A, k]`` indices of the nearest other agents, closest first.
    landmark_idx : Tensor or None
        ``[E, A, kl]`` indices of the nearest obstacles, closest first.
    """

    force: Tensor
    caught: Tensor
    agent_idx: Tensor | None
    landmark_idx: Tensor | None


def contact_coefficient(dist: Tensor, dist_min: Tensor, c: TagConstants) -> Tensor:
    """Return ``contact_force * penetration / dist`` for distances ``dist``.

    ``penetration = margin * log(1 + exp((dist_min - dist) / margin))`` is the
    softened overlap used by the particle-world physics; the force on an agent is
    ``-coefficient * (p_other - p_self)``.
    """
    pen = softplus((dist_min - dist) / c.contact_margin) * c.contact_margin
    return pen * c.contact_force / dist


def _dense_chunk(
    ent: Tensor, c: TagConstants, k: int | None, kl: int | None
) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
    a = c.num_agents
    pos = ent[:, :a]
    rel = ent[:, None, :, :] - pos[:, :, None, :]  # [e, A, N, 2]: other - self
    dist = rel.square().sum(-1).sqrt_()  # [e, A, N]
    dist[:, :, :a].diagonal(0, 1, 2).fill_(float("inf"))
    coef = contact_coefficient(dist, c.dist_min, c)
    force = -(coef.unsqueeze(-1) * rel).sum(2)
    d_agents = dist[:, :, :a]
    caught = ((d_agents < c.dist_min[:, :a]) & c.opposite).sum(-1)
    agent_idx = None
    if k is not None and k > 0:
        agent_idx = d_agents.topk(k, dim=-1, largest=False, sorted=True).indices
    landmark_idx = None
    if kl is not None and kl > 0:
        landmark_idx = dist[:, :, a:].topk(kl, dim=-1, largest=False, sorted=True).indices
    return force, caught, agent_idx, landmark_idx


def dense_pass(
    pos: Tensor,
    lm: Tensor,
    c: TagConstants,
    k: int | None,
    kl: int | None,
    chunk_elems: int = 1 << 22,
) -> PassResult:
    """Pairwise pass over all pairs of each environment.

    Parameters
    ----------
    pos, lm : Tensor
        ``[E, A, 2]`` agent and ``[E, L, 2]`` obstacle positions.
    c : TagConstants
        World constants.
    k, kl : int or None
        Number of nearest agents / obstacles to return (already capped at the
        number available), or ``None`` to skip the neighbour search.
    chunk_elems : int
        Upper bound on ``e * A * (A + L)`` pair elements processed at once; bounds
        the temporary memory at about ``40 * chunk_elems`` bytes.

    Returns
    -------
    PassResult
        Forces, collision counts and neighbour indices.

    Examples
    --------
    >>> # see marl.simple_tag.SimpleTag, which builds the constants
    """
    ent = torch.cat((pos, lm), dim=1)
    e, n, _ = ent.shape
    per_env = c.num_agents * n
    step = max(1, chunk_elems // max(per_env, 1))
    if step >= e:
        return PassResult(*_dense_chunk(ent, c, k, kl))
    parts = [_dense_chunk(ent[i : i + step], c, k, kl) for i in range(0, e, step)]
    force = torch.cat([p[0] for p in parts])
    caught = torch.cat([p[1] for p in parts])
    agent_idx = torch.cat([p[2] for p in parts]) if parts[0][2] is not None else None
    landmark_idx = torch.cat([p[3] for p in parts]) if parts[0][3] is not None else None
    return PassResult(force, caught, agent_idx, landmark_idx)


def action_force(actions: Tensor, c: TagConstants, continuous: bool) -> Tensor:
    """Map actions to the applied force ``[E, A, 2]`` (already scaled by ``accel``).

    Discrete ``a`` in ``0..4`` means no-op, left, right, down, up; a continuous
    action ``v`` of length 5 (clipped to ``[0, 1]``) gives ``(v2 - v1, v4 - v3)``.
    """
    if continuous:
        v = actions.clamp(0.0, 1.0)
        u = torch.stack((v[..., 2] - v[..., 1], v[..., 4] - v[..., 3]), dim=-1)
    else:
        table = torch.tensor(
            [[0.0, 0.0], [-1.0, 0.0], [1.0, 0.0], [0.0, -1.0], [0.0, 1.0]],
            dtype=c.accel.dtype,
            device=c.accel.device,
        )
        u = table[actions]
    return u * c.accel[:, None]


def integrate(pos: Tensor, vel: Tensor, force: Tensor, c: TagConstants) -> None:
    """Advance agent positions and velocities in place by one time step.

    Position moves with the old velocity, then velocity is damped, accelerated
    by ``force`` (unit mass) and rescaled to at most ``max_speed``.
    """
    pos.add_(vel, alpha=c.dt)
    vel.mul_(1.0 - c.damping).add_(force, alpha=c.dt)
    speed = vel.square().sum(-1, keepdim=True).sqrt_()
    cap = c.max_speed[:, None]
    scale = torch.where(speed > cap, cap / speed, torch.ones_like(speed))
    vel.mul_(scale)


def bound_penalty(pos: Tensor) -> Tensor:
    """Sum over both axes of the out-of-area penalty for good agents.

    ``bound(x) = 0`` for ``x < 0.9``, ``10 (x - 0.9)`` for ``x < 1`` and
    ``min(exp(2x - 2), 10)`` beyond, applied to ``|x|`` and ``|y|``.
    """
    x = pos.abs()
    ramp = (x - 0.9) * 10.0
    outer = torch.exp(2.0 * x - 2.0).clamp_(max=10.0)
    b = torch.where(x < 0.9, torch.zeros_like(x), torch.where(x < 1.0, ramp, outer))
    return b.sum(-1)


def rewards(pos: Tensor, caught: Tensor, c: TagConstants) -> Tensor:
    """Per-agent rewards ``[E, A]`` from collision counts and positions.

    Every adversary receives ``+10`` per (good, adversary) pair in collision in
    its environment; each good agent gets ``-10`` per adversary touching it and
    the boundary penalty.
    """
    good = c.is_good
    catches = (caught * good).sum(-1, keepdim=True).to(pos.dtype)  # [E, 1]
    good_rew = -10.0 * caught.to(pos.dtype) - bound_penalty(pos)
    return torch.where(good, good_rew, 10.0 * catches)
