"""Replay buffers for off-policy learning: uniform and proportional prioritised, and n-step.

A buffer stores flat transitions (``obs``, ``actions``, ``rewards``, ``next_obs``,
``discounts``) in preallocated numpy arrays, first in first out once full. The arrays are
made on the first :meth:`ReplayBuffer.add` from that batch's shapes and dtypes, so one
buffer class serves every observation and action space (and a replay shard on its own
worker needs no env to build it).

:class:`PrioritizedReplay` samples index ``i`` with probability ``p_i / sum p`` (``p`` are
priorities raised to ``alpha``) from a :class:`SumTree`; sampling and updating descend or
climb the tree one level at a time for a whole batch at once (numpy), never one sample at a
time in Python. :func:`nstep_transitions` folds ``n`` consecutive env steps into one
transition on the actor, so the learner's target is ``rewards + discounts * Q(next_obs)``
whatever ``n``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

Batch = dict[str, Any]

FIELDS = ("obs", "actions", "rewards", "next_obs", "discounts")
"""The arrays of a transition batch: ``discounts`` is ``gamma ** k`` for a transition of
``k`` env steps that did not end in a terminal state, else 0 (the target's bootstrap factor)."""


class SumTree:
    """A binary tree whose every node holds the sum of its two children, over ``capacity``
    leaves, stored as one numpy array (leaves at ``[size, 2 * size)``).

    Examples
    --------
    >>> tree = SumTree(4)
    >>> tree.set(np.array([0, 1, 2, 3]), np.array([1.0, 2.0, 3.0, 4.0]))
    >>> tree.total
    10.0
    >>> tree.find(np.array([0.5, 1.5, 9.9])).tolist()
    [0, 1, 3]
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = int(capacity)
        self.size = 1 << max(0, (self.capacity - 1).bit_length())  # leaves: a power of two
        self.depth = self.size.bit_length() - 1
        self.nodes = np.zeros(2 * self.size, dtype=np.float64)

    @property
    def total(self) -> float:
        """The sum of every leaf."""
        return float(self.nodes[1])

    def leaves(self, indices: np.ndarray) -> np.ndarray:
        """The values of the leaves ``indices``."""
        return self.nodes[self.size + np.asarray(indices)]

    def set(self, indices: np.ndarray, values: np.ndarray) -> None:
        """Set leaves ``indices`` to ``values`` and recompute their ancestors' sums.

        Parents are recomputed from their children (not incremented), so rounding errors do
        not accumulate over millions of updates.
        """
        node = self.size + np.asarray(indices, dtype=np.int64)
        self.nodes[node] = values  # a repeated index keeps its last value, as numpy assigns
        for _ in range(self.depth):
            node = np.unique(node >> 1)
            self.nodes[node] = self.nodes[2 * node] + self.nodes[2 * node + 1]

    def find(self, mass: np.ndarray) -> np.ndarray:
        """For each value in ``mass`` (in ``[0, total)``), the leaf where the running sum of
        the leaves passes it: leaf ``i`` is found with probability ``leaf_i / total`` for a
        uniform ``mass``."""
        mass = np.array(mass, dtype=np.float64)
        node = np.ones(len(mass), dtype=np.int64)
        for _ in range(self.depth):
            left = 2 * node
            right = mass >= self.nodes[left]
            mass -= self.nodes[left] * right
            node = left + right
        leaf = node - self.size
        # rounding can step past the last non-empty leaf: take the largest filled one left of it
        empty = self.nodes[node] <= 0
        if empty.any():
            filled = np.flatnonzero(self.nodes[self.size:self.size + self.capacity] > 0)
            if len(filled):
                pos = np.searchsorted(filled, leaf[empty], side="right") - 1
                leaf[empty] = filled[np.clip(pos, 0, len(filled) - 1)]
        return leaf


class ReplayBuffer:
    """A uniform first-in-first-out replay buffer of ``capacity`` transitions.

    Parameters
    ----------
    capacity : int
        The most transitions held; beyond it the oldest are overwritten.
    seed : int
        Seeds the sampling.
    sample_rows : int
        Rows to sample per iteration when it serves a learner on another worker (a replay
        shard under ``apex``: the learner's gradient steps per iteration times its batch).

    Examples
    --------
    >>> buf = ReplayBuffer(3, seed=0)
    >>> buf.add({"obs": np.arange(4.0)[:, None], "rewards": np.arange(4.0)})
    >>> len(buf), sorted(buf.data["rewards"].tolist())  # the oldest was evicted
    (3, [1.0, 2.0, 3.0])
    >>> sample = buf.sample(5)
    >>> sample["obs"].shape, sample["weights"].tolist()
    ((5, 1), [1.0, 1.0, 1.0, 1.0, 1.0])
    """

    prioritized = False

    def __init__(self, capacity: int, seed: int = 0, sample_rows: int = 0) -> None:
        if capacity < 1:
            raise ValueError(f"replay capacity must be >= 1 (--buffer-size), got {capacity}")
        self.capacity = int(capacity)
        self.sample_rows = int(sample_rows)
        self.rng = np.random.default_rng(seed)
        self.data: dict[str, np.ndarray] = {}
        self.pos = 0  # the next row written
        self.size = 0
        self.added = 0  # transitions ever added (evicted ones included)

    def __len__(self) -> int:
        return self.size

    @property
    def nbytes(self) -> int:
        """Bytes of the arrays held (all ``capacity`` rows: they are allocated at once)."""
        return sum(a.nbytes for a in self.data.values())

    def _allocate(self, batch: Mapping[str, np.ndarray]) -> None:
        for key, value in batch.items():
            value = np.asarray(value)
            self.data[key] = np.zeros((self.capacity, *value.shape[1:]), dtype=value.dtype)

    def _write(self, batch: Mapping[str, Any]) -> np.ndarray:
        """Copy ``batch``'s arrays (all but ``stats``) in, FIFO; return the rows written."""
        arrays = {k: np.asarray(v) for k, v in batch.items() if k != "stats"}
        if not arrays:
            return np.zeros(0, dtype=np.int64)
        n = len(next(iter(arrays.values())))
        if not self.data:
            self._allocate(arrays)
        if set(arrays) != set(self.data):
            raise ValueError(f"replay: a batch with arrays {sorted(arrays)} does not match the "
                             f"buffer's {sorted(self.data)}")
        if n > self.capacity:  # only the newest capacity rows survive anyway
            arrays = {k: v[n - self.capacity:] for k, v in arrays.items()}
            self.added += n - self.capacity
            n = self.capacity
        rows = (self.pos + np.arange(n)) % self.capacity
        for key, value in arrays.items():
            self.data[key][rows] = value
        self.pos = int((self.pos + n) % self.capacity)
        self.size = min(self.capacity, self.size + n)
        self.added += n
        return rows

    def add(self, batch: Mapping[str, Any], priorities: np.ndarray | None = None) -> None:
        """Append the transitions of ``batch`` (``priorities`` are ignored: uniform)."""
        self._write(batch)

    def _gather(self, rows: np.ndarray) -> Batch:
        return {k: v[rows] for k, v in self.data.items()}

    def sample(self, n: int, beta: float = 0.0) -> Batch:
        """``n`` transitions drawn uniformly with replacement, with ``indices`` and
        importance ``weights`` (all 1) and ``stats`` (``size``, ``total``)."""
        if self.size == 0:
            raise ValueError("replay: cannot sample from an empty buffer; wait for "
                             "--learning-starts transitions first")
        rows = self.rng.integers(0, self.size, n)
        out = self._gather(rows)
        out.update(indices=rows, weights=np.ones(n, np.float32),
                   priorities=np.ones(n, np.float64),
                   stats={"size": self.size, "total": float(self.size)})
        return out

    def update_priorities(self, indices: np.ndarray, priorities: np.ndarray) -> None:
        """No-op for a uniform buffer."""

    def state_dict(self) -> dict[str, Any]:
        """Contents and sampling state, for a checkpoint (only the filled rows, as CPU
        tensors: checkpoints load with ``torch.load(weights_only=True)``)."""
        return {"capacity": self.capacity, "pos": self.pos, "size": self.size,
                "added": self.added, "rng": self.rng.bit_generator.state,
                "data": {k: torch.from_numpy(v[:self.size].copy())
                         for k, v in self.data.items()}}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned (same capacity)."""
        if int(state["capacity"]) != self.capacity:
            raise ValueError(f"replay: the checkpoint's buffer holds {state['capacity']} "
                             f"transitions, this one {self.capacity}; resume with the same "
                             "--buffer-size")
        self.data = {}
        if state["data"]:
            arrays = {k: np.asarray(v) for k, v in state["data"].items()}
            self._allocate(arrays)
            for key, value in arrays.items():
                self.data[key][:len(value)] = value
        self.pos, self.size = int(state["pos"]), int(state["size"])
        self.added = int(state["added"])
        self.rng.bit_generator.state = state["rng"]


class PrioritizedReplay(ReplayBuffer):
    """Proportional prioritised replay (Schaul et al. 2016) over a :class:`SumTree`.

    Transition ``i`` is drawn with probability ``P(i) = p_i ** alpha / sum_k p_k ** alpha``;
    its importance weight is ``(size * P(i)) ** -beta``, divided by the largest weight of
    the sample. New transitions get the priority they are added with (Ape-X's actors
    compute it), else the largest priority seen so far.

    Examples
    --------
    >>> buf = PrioritizedReplay(4, alpha=1.0, seed=0)
    >>> buf.add({"rewards": np.zeros(4)}, priorities=np.array([1.0, 0.0, 0.0, 9.0]))
    >>> s = buf.sample(1000, beta=1.0)
    >>> sorted(set(s["indices"].tolist())), round(float((s["indices"] == 3).mean()), 1)
    ([0, 3], 0.9)
    >>> buf.update_priorities(np.array([3]), np.array([0.0]))
    >>> set(buf.sample(10)["indices"].tolist())
    {0}
    """

    prioritized = True

    def __init__(self, capacity: int, alpha: float = 0.6, seed: int = 0,
                 eps: float = 1e-6, sample_rows: int = 0) -> None:
        super().__init__(capacity, seed, sample_rows)
        self.alpha, self.eps = float(alpha), float(eps)
        self.tree = SumTree(self.capacity)
        self.max_priority = 1.0

    @property
    def nbytes(self) -> int:
        """Bytes of the arrays held, the sum-tree included."""
        return super().nbytes + self.tree.nodes.nbytes

    def _scaled(self, priorities: np.ndarray) -> np.ndarray:
        return (np.abs(np.asarray(priorities, np.float64)) + self.eps) ** self.alpha

    def add(self, batch: Mapping[str, Any], priorities: np.ndarray | None = None) -> None:
        """Append ``batch``'s transitions with ``priorities`` (default: the largest seen)."""
        rows = self._write(batch)
        if not len(rows):
            return
        if priorities is None:
            values = np.full(len(rows), self.max_priority ** self.alpha)
        else:
            priorities = np.asarray(priorities, np.float64)[-len(rows):]
            self.max_priority = max(self.max_priority, float(np.abs(priorities).max()))
            values = self._scaled(priorities)
        self.tree.set(rows, values)

    def sample(self, n: int, beta: float = 0.4) -> Batch:
        """``n`` transitions drawn in proportion to their priorities (with replacement),
        with ``indices``, importance ``weights``, their ``priorities`` (``p ** alpha``) and
        ``stats`` (``size`` and ``total``, the sum of ``p ** alpha``)."""
        if self.size == 0:
            raise ValueError("replay: cannot sample from an empty buffer; wait for "
                             "--learning-starts transitions first")
        total = self.tree.total
        rows = self.tree.find(self.rng.random(n) * total)
        scaled = self.tree.leaves(rows)
        out = self._gather(rows)
        out.update(indices=rows, priorities=scaled,
                   weights=importance_weights(scaled / total, self.size, beta),
                   stats={"size": self.size, "total": total})
        return out

    def update_priorities(self, indices: np.ndarray, priorities: np.ndarray) -> None:
        """Set the priorities of the transitions at ``indices`` (e.g. new TD errors)."""
        priorities = np.asarray(priorities, np.float64)
        if len(priorities):
            self.max_priority = max(self.max_priority, float(np.abs(priorities).max()))
            self.tree.set(np.asarray(indices, np.int64), self._scaled(priorities))

    def state_dict(self) -> dict[str, Any]:
        """Contents, priorities and sampling state, for a checkpoint."""
        state = super().state_dict()
        state.update(leaves=torch.from_numpy(self.tree.leaves(np.arange(self.size)).copy()),
                     max_priority=self.max_priority)
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned (same capacity)."""
        super().load_state_dict(state)
        self.tree = SumTree(self.capacity)
        self.tree.set(np.arange(self.size), np.asarray(state["leaves"], np.float64))
        self.max_priority = float(state["max_priority"])


def importance_weights(probs: np.ndarray, size: int, beta: float) -> np.ndarray:
    """``(size * probs) ** -beta`` divided by its maximum (float32).

    Examples
    --------
    >>> importance_weights(np.array([0.5, 0.25]), size=4, beta=1.0).tolist()
    [0.5, 1.0]
    """
    w = (size * np.maximum(probs, 1e-300)) ** (-beta)
    return (w / w.max()).astype(np.float32)


def make_replay(capacity: int, prioritized: bool, alpha: float = 0.6, seed: int = 0,
                sample_rows: int = 0) -> ReplayBuffer:
    """A :class:`PrioritizedReplay` or a uniform :class:`ReplayBuffer`.

    Examples
    --------
    >>> type(make_replay(10, prioritized=True)).__name__
    'PrioritizedReplay'
    """
    if prioritized:
        return PrioritizedReplay(capacity, alpha, seed, sample_rows=sample_rows)
    return ReplayBuffer(capacity, seed, sample_rows)


def merge_samples(samples: Sequence[Batch], n: int, beta: float, rng: np.random.Generator,
                  prioritized: bool = True) -> tuple[Batch, list[np.ndarray]]:
    """One sample of ``n`` from several shards' samples, in proportion to their totals.

    Each shard sampled ``n`` transitions from itself (in proportion to its priorities);
    shard ``j`` then supplies ``c_j`` of them, ``c ~ Multinomial(n, total_j / sum total)``,
    so each transition is drawn with probability ``p_i / sum over all shards of p``, as
    from one buffer. Importance weights are recomputed over all shards. Returns the merged
    sample and, per shard, which of its rows were used (for the priority updates).

    Examples
    --------
    >>> a, b = PrioritizedReplay(8, alpha=1.0, seed=1), PrioritizedReplay(8, alpha=1.0, seed=2)
    >>> a.add({"x": np.zeros(8)}, np.ones(8)); b.add({"x": np.ones(8)}, 3 * np.ones(8))
    >>> merged, used = merge_samples([a.sample(4000), b.sample(4000)], 4000, 0.4,
    ...                              np.random.default_rng(0))
    >>> abs(merged["x"].mean() - 0.75) < 0.03, sum(len(u) for u in used)  # 3 / (1 + 3)
    (np.True_, 4000)
    """
    totals = np.array([s["stats"]["total"] for s in samples], np.float64)
    size = sum(int(s["stats"]["size"]) for s in samples)
    counts = rng.multinomial(n, totals / totals.sum())
    used = [np.arange(c) for c in counts]
    parts = [{k: v[:c] for k, v in s.items() if k != "stats"} for s, c in
             zip(samples, counts, strict=True)]
    merged = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    if prioritized:
        merged["weights"] = importance_weights(merged["priorities"] / totals.sum(), size, beta)
    merged["shards"] = np.repeat(np.arange(len(samples)), counts)
    return merged, used


def nstep_transitions(steps: Mapping[str, np.ndarray], n: int, gamma: float
                      ) -> tuple[Batch, dict[str, np.ndarray]]:
    """Fold env steps into ``n``-step transitions; return them and the steps kept for later.

    ``steps`` holds time-major arrays ``[T, E]`` (``E`` envs): ``obs``, ``actions``,
    ``rewards``, ``next_obs`` (the observation after the step: the final one when the
    episode ended there), ``terminated``, ``done`` (terminated or truncated) and ``pending``
    (a step that starts a transition not yet emitted: not a reset step, and not emitted by
    an earlier call). A transition from step ``t`` covers steps ``t .. t + k - 1`` with
    ``k = n``, or fewer when its episode ends first; its ``rewards`` is the discounted sum
    and ``discounts`` is ``gamma ** k``, or 0 when it ended in a terminal state. A step whose
    ``n`` steps are not all in ``steps`` yet (nor its episode's end) is not emitted: the last
    ``n - 1`` steps come back with their ``pending`` flags, to be put in front of the next
    call's steps. Loops over ``n``, never over steps or envs.

    Examples
    --------
    >>> T, E = 4, 1
    >>> steps = {"obs": np.arange(T, dtype=np.float32).reshape(T, E, 1),
    ...          "actions": np.zeros((T, E), np.int64), "rewards": np.ones((T, E)),
    ...          "next_obs": np.arange(1, T + 1, dtype=np.float32).reshape(T, E, 1),
    ...          "terminated": np.array([[0], [1], [0], [0]], bool),
    ...          "pending": np.array([[1], [1], [0], [1]], bool)}
    >>> steps["done"] = steps["terminated"].copy()
    >>> out, keep = nstep_transitions(steps, n=2, gamma=0.5)
    >>> out["rewards"].tolist(), out["discounts"].tolist(), keep["pending"][:, 0].tolist()
    ([1.5, 1.0], [0.0, 0.0], [True])
    """
    T = len(steps["rewards"])
    t = np.arange(T)[:, None]
    done = steps["done"].astype(bool)
    rewards = steps["rewards"].astype(np.float64)
    ret = np.zeros(rewards.shape)
    end = np.broadcast_to(t, rewards.shape).copy()
    alive = np.ones(rewards.shape, bool)  # no episode end before step t + k
    for k in range(n):
        idx = t + k
        inside = idx < T
        safe = np.minimum(idx, T - 1)
        use = alive & inside
        ret += np.where(use, (gamma ** k) * np.take_along_axis(rewards, np.broadcast_to(
            safe, rewards.shape), 0), 0.0)
        end = np.where(use, np.broadcast_to(safe, end.shape), end)
        alive = use & ~np.take_along_axis(done, np.broadcast_to(safe, done.shape), 0)
    ended = np.take_along_axis(done, end, 0)  # stopped at an episode's end
    ready = ended | (t + n - 1 < T)
    emit = ready & steps["pending"].astype(bool)
    length = end - t + 1
    term = np.take_along_axis(steps["terminated"].astype(bool), end, 0)
    discounts = np.where(term, 0.0, gamma ** length)
    rows, envs = np.nonzero(emit)
    out: Batch = {
        "obs": steps["obs"][rows, envs],
        "actions": steps["actions"][rows, envs],
        "rewards": ret[rows, envs].astype(np.float32),
        "next_obs": steps["next_obs"][end[rows, envs], envs],
        "discounts": discounts[rows, envs].astype(np.float32),
    }
    cut = max(0, T - (n - 1))
    keep = {k: v[cut:] for k, v in steps.items()}
    keep["pending"] = (steps["pending"].astype(bool) & ~emit)[cut:]
    return out, keep


def concat_steps(before: Mapping[str, np.ndarray] | None, after: Mapping[str, np.ndarray]
                 ) -> dict[str, np.ndarray]:
    """``before``'s steps (kept by :func:`nstep_transitions`) followed by ``after``'s.

    Examples
    --------
    >>> concat_steps({"r": np.zeros((1, 2))}, {"r": np.ones((3, 2))})["r"].shape
    (4, 2)
    """
    if not before:
        return dict(after)
    return {k: np.concatenate([before[k], v]) for k, v in after.items()}


def transition_nbytes(obs_shape: Sequence[int], obs_dtype: Any, action_shape: Sequence[int],
                      action_dtype: Any, prioritized: bool) -> int:
    """Bytes one transition takes in a buffer: ``obs`` and ``next_obs``, the action, reward
    and discount (float32), plus the sum-tree's two float64 nodes per leaf when prioritised
    (the tree rounds the capacity up to a power of two: at most twice that).

    Examples
    --------
    >>> transition_nbytes((4,), np.float32, (), np.int64, prioritized=False)
    48
    """
    obs = int(np.prod(obs_shape)) * np.dtype(obs_dtype).itemsize
    act = int(np.prod(action_shape)) * np.dtype(action_dtype).itemsize
    return 2 * obs + act + 8 + (16 if prioritized else 0)
