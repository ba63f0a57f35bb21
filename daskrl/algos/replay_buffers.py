"""Replay buffers for off-policy learning: uniform and proportional prioritised.

A buffer stores flat transitions (``obs``, ``actions``, ``rewards``, ``next_obs``,
``discounts``) in preallocated numpy arrays, first in first out once full. The arrays are
made on the first :meth:`ReplayBuffer.add` from that batch's shapes and dtypes, so one
buffer class serves every observation and action space (and a replay shard on its own
worker needs no env to build it).

:class:`PrioritizedReplay` samples index ``i`` with probability ``p_i / sum p`` (``p`` are
priorities raised to ``alpha``) from a :class:`~daskrl.algos.sum_tree.SumTree`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from daskrl.algos.sum_tree import SumTree

Batch = dict[str, Any]

FIELDS = ("obs", "actions", "rewards", "next_obs", "discounts")
"""The arrays of a transition batch: ``discounts`` is ``gamma ** k`` for a transition of
``k`` env steps that did not end in a terminal state, else 0 (the target's bootstrap factor)."""


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
    save : bool
        Whether checkpoints hold its contents (off: ``--no-save-replay``; a resumed run
        then starts with it empty).

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

    def __init__(self, capacity: int, seed: int = 0, sample_rows: int = 0,
                 save: bool = True) -> None:
        if capacity < 1:
            raise ValueError(f"replay capacity must be >= 1 (--buffer-size), got {capacity}")
        self.capacity = int(capacity)
        self.sample_rows = int(sample_rows)
        self.save = bool(save)
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
        if "rng" in state:  # a re-sharded state has none: keep this seed's
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
                 eps: float = 1e-6, sample_rows: int = 0, save: bool = True) -> None:
        super().__init__(capacity, seed, sample_rows, save)
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
