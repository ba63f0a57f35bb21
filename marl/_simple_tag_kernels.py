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

    @classmethod
    def build(
        cls,
        num_adversaries: int,
        num_good: int,
        num_obstacles: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> TagConstants:
        """Constants of ``mpe2``'s simple tag: adversaries radius 0.075, accel 3,
        max speed 1; good agents 0.05, 4, 1.3; obstacles radius 0.2."""
        na, ng = num_adversaries, num_good

        def per_team(adversary: float, good_agent: float) -> Tensor:
            return torch.tensor([adversary] * na + [good_agent] * ng, dtype=dtype, device=device)

        good = torch.arange(na + ng, device=device) >= na
        size = per_team(0.075, 0.05)
        ent_size = torch.cat((size, torch.full((num_obstacles,), 0.2, dtype=dtype, device=device)))
        return cls(
            num_agents=na + ng,
            num_landmarks=num_obstacles,
            accel=per_team(3.0, 4.0),
            max_speed=per_team(1.0, 1.3),
            size=size,
            is_good=good,
            dist_min=size[:, None] + ent_size[None, :],
            opposite=good[:, None] ^ good[None, :],
        )


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
    features : Tensor or None
        Per-environment flattened state the pass was computed from (pair engine).
    """

    force: Tensor
    caught: Tensor
    agent_idx: Tensor | None
    landmark_idx: Tensor | None
    features: Tensor | None = None

    def assign_rows(self, rows: Tensor, other: PassResult) -> None:
        """Overwrite environment ``rows`` with the pass result ``other`` of those rows."""
        self.force[rows] = other.force
        self.caught[rows] = other.caught
        if self.agent_idx is not None and other.agent_idx is not None:
            self.agent_idx[rows] = other.agent_idx
        if self.landmark_idx is not None and other.landmark_idx is not None:
            self.landmark_idx[rows] = other.landmark_idx


SOFTPLUS_FLOOR = -40.0


def contact_coefficient(dist: Tensor, dist_min: Tensor, c: TagConstants) -> Tensor:
    """Return ``contact_force * penetration / dist`` for distances ``dist``.

    ``penetration = margin * log(1 + exp((dist_min - dist) / margin))`` is the
    softened overlap used by the particle-world physics; the force on an agent is
    ``-coefficient * (p_other - p_self)``. The exponent is floored at -40 (a gap
    of 0.04 beyond contact), where the force is below ``1e-17``: this keeps the
    exponential out of its slow subnormal range.
    """
    z = torch.addcdiv(dist_min / c.contact_margin, dist, dist.new_full((), -c.contact_margin))
    pen = softplus(z.clamp_(min=SOFTPLUS_FLOOR)).mul_(c.contact_margin * c.contact_force)
    return pen.div_(dist)


def _dense_chunk(
    ent: Tensor, c: TagConstants, k: int | None, kl: int | None
) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
    a = c.num_agents
    px, py = ent[..., 0].contiguous(), ent[..., 1].contiguous()  # [e, N]
    dx = px[:, None, :] - px[:, :a, None]  # [e, A, N]: other - self
    dy = py[:, None, :] - py[:, :a, None]
    dist = torch.addcmul(dx * dx, dy, dy).sqrt_()
    dist[:, :, :a].diagonal(0, 1, 2).fill_(float("inf"))
    coef = contact_coefficient(dist, c.dist_min, c)
    force = torch.stack(((coef * dx).sum(-1).neg_(), (coef * dy).sum(-1).neg_()), dim=-1)
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
        the temporary memory at about ``8 * 4 * chunk_elems`` bytes (float32).

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


class ActionMap:
    """Turns actions into applied forces ``[E, A, 2]`` (already scaled by ``accel``).

    Discrete ``a`` in ``0..4`` means no-op, left, right, down, up (unit force
    times ``accel``); a continuous action ``v`` of length 5, clipped to
    ``[0, 1]``, gives ``accel * (v2 - v1, v4 - v3)``.

    Parameters
    ----------
    c : TagConstants
        World constants.
    num_envs : int
        Rows of the action batches.
    continuous : bool
        Float ``[E, A, 5]`` actions instead of integer ``[E, A]`` ones.
    names : sequence of str, optional
        Agent names, for errors that name the agent at fault.
    """

    def __init__(self, c: TagConstants, num_envs: int, continuous: bool,
                 names: tuple[str, ...] = ()) -> None:
        self.names = names or tuple(f"agent {i}" for i in range(c.num_agents))
        a, dt, dev = c.num_agents, c.accel.dtype, c.accel.device
        dirs = torch.tensor(
            [[0.0, 0.0], [-1.0, 0.0], [1.0, 0.0], [0.0, -1.0], [0.0, 1.0]], dtype=dt, device=dev
        )
        self.table = (dirs[None] * c.accel[:, None, None]).reshape(a * 5, 2)
        self.offset = torch.arange(a, device=dev) * 5
        self.diff = torch.tensor(
            [[0.0, 0.0], [-1.0, 0.0], [1.0, 0.0], [0.0, -1.0], [0.0, 1.0]], dtype=dt, device=dev
        )
        self.accel = c.accel[None, :, None].expand(num_envs, a, 2).contiguous()
        self.shape = (num_envs, a)
        self.dtype = dt
        self.continuous = continuous

    def check(self, actions: Tensor, device: torch.device) -> Tensor:
        """Validate a batch of actions and move it to ``device``.

        Raises
        ------
        ValueError
            On a wrong shape or dtype, a discrete action outside ``0..4`` or a NaN/inf
            continuous one; the message names the first (env, agent) at fault.
        """
        if not isinstance(actions, Tensor):
            actions = torch.as_tensor(actions)
        e, a = self.shape
        if self.continuous:
            if actions.shape != (e, a, 5) or not actions.is_floating_point():
                raise ValueError(
                    f"actions must be a float tensor of shape [{e}, {a}, 5] for continuous "
                    f"actions, got {actions.dtype} {tuple(actions.shape)}"
                )
            actions = actions.to(device=device, dtype=self.dtype)
            finite = torch.isfinite(actions).all(-1)
            if not bool(finite.all()):
                env, agent = (int(i) for i in (~finite).nonzero()[0])
                raise ValueError(
                    f"actions[{env}, {agent}] (agent {self.names[agent]!r}) = "
                    f"{actions[env, agent].tolist()}: not finite; expected Box(0.0, 1.0, (5,))")
            return actions
        if actions.shape != (e, a) or actions.is_floating_point() or actions.dtype == torch.bool:
            raise ValueError(
                f"actions must be an integer tensor of shape [{e}, {a}] with values 0..4, "
                f"got {actions.dtype} {tuple(actions.shape)}; pass continuous_actions=True "
                "for float actions"
            )
        actions = actions.to(device=device, dtype=torch.long)
        low, high = torch.aminmax(actions)
        if int(low) < 0 or int(high) > 4:
            env, agent = (int(i) for i in ((actions < 0) | (actions > 4)).nonzero()[0])
            raise ValueError(
                f"actions[{env}, {agent}] (agent {self.names[agent]!r}) = "
                f"{int(actions[env, agent])}: outside Discrete(5); actions must lie in 0..4 "
                "(no-op, left, right, down, up)")
        return actions

    def __call__(self, actions: Tensor) -> Tensor:
        """Force ``[E, A, 2]`` for actions ``[E, A]`` (int) or ``[E, A, 5]`` (float)."""
        if self.continuous:
            e, a, _ = actions.shape
            u = actions.clamp(0.0, 1.0).reshape(e * a, 5) @ self.diff
            return u.view(e, a, 2).mul_(self.accel)
        return torch.nn.functional.embedding(actions + self.offset, self.table)


def integrate(pos: Tensor, vel: Tensor, force: Tensor, cap: Tensor, c: TagConstants) -> None:
    """Advance agent positions and velocities in place by one time step.

    Position moves with the old velocity, then velocity is damped, accelerated
    by ``force`` (unit mass) and rescaled to at most ``cap`` (``[E, A]``, the
    per-agent ``max_speed`` expanded over environments).
    """
    pos.add_(vel, alpha=c.dt)
    vel.mul_(1.0 - c.damping).add_(force, alpha=c.dt)
    sq = vel.square()
    speed = (sq[..., 0] + sq[..., 1]).sqrt_()
    scale = torch.div(cap, speed).clamp_(max=1.0)
    vel[..., 0].mul_(scale)
    vel[..., 1].mul_(scale)


def bound_penalty(pos: Tensor) -> Tensor:
    """Sum over both axes of the out-of-area penalty for good agents.

    ``bound(x) = 0`` for ``x < 0.9``, ``10 (x - 0.9)`` for ``x < 1`` and
    ``min(exp(2x - 2), 10)`` beyond, applied to ``|x|`` and ``|y|``.
    """
    x = pos.abs()
    ramp = (x - 0.9).mul_(10.0).clamp_(min=0.0)
    outer = torch.exp(2.0 * x - 2.0).clamp_(max=10.0)
    b = torch.where(x < 1.0, ramp, outer)
    return b[..., 0] + b[..., 1]


def rewards(pos: Tensor, caught: Tensor, c: TagConstants, num_adversaries: int) -> Tensor:
    """Per-agent rewards ``[E, A]`` from collision counts and positions.

    Every adversary receives ``+10`` per (good, adversary) pair in collision in
    its environment; each good agent gets ``-10`` per adversary touching it and
    the boundary penalty.
    """
    na = num_adversaries
    caught_good = caught[:, na:].to(pos.dtype)
    rew = torch.empty(caught.shape, dtype=pos.dtype, device=pos.device)
    rew[:, :na] = caught_good.sum(-1, keepdim=True) * 10.0
    torch.sub(caught_good.mul_(-10.0), bound_penalty(pos[:, na:]), out=rew[:, na:])
    return rew
