"""Several replay shards seen as one buffer: merging their samples in proportion to their
total priorities, and re-dealing saved shards' contents over another number of shards."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from daskrl.algos.replay_buffers import Batch, importance_weights


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
    >>> from daskrl.algos.replay_buffers import PrioritizedReplay
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


def oldest_first(state: Mapping[str, Any]) -> np.ndarray:
    """The filled rows of a saved buffer (:meth:`ReplayBuffer.state_dict`), oldest first.

    Examples
    --------
    >>> oldest_first({"capacity": 4, "pos": 1, "size": 4}).tolist()  # row 1 is the oldest
    [1, 2, 3, 0]
    >>> oldest_first({"capacity": 4, "pos": 3, "size": 3}).tolist()
    [0, 1, 2]
    """
    capacity, pos, size = int(state["capacity"]), int(state["pos"]), int(state["size"])
    return (pos - size + np.arange(size)) % capacity


def reshard(states: Sequence[Mapping[str, Any]], shards: int, shard: int, capacity: int
            ) -> dict[str, Any]:
    """The state of shard ``shard`` of ``shards`` (``capacity`` transitions each) dealt from
    saved shard states of another count: every saved shard's transitions, oldest first,
    concatenated, and every ``shards``-th of them from position ``shard`` on, with their
    priorities; beyond ``capacity`` the newest are kept (as FIFO eviction would). Load it
    with ``load_state_dict`` (the buffer keeps its own sampling seed).

    Examples
    --------
    >>> from daskrl.algos.replay_buffers import PrioritizedReplay
    >>> a, b = PrioritizedReplay(4, alpha=1.0), PrioritizedReplay(4, alpha=1.0)
    >>> a.add({"x": np.arange(3.0)}, np.ones(3)); b.add({"x": np.arange(10.0, 12.0)}, np.ones(2))
    >>> saved = [a.state_dict(), b.state_dict()]
    >>> [reshard(saved, 3, j, capacity=4)["data"]["x"].tolist() for j in range(3)]
    [[0.0, 10.0], [1.0, 11.0], [2.0]]
    >>> one = PrioritizedReplay(8, alpha=1.0)
    >>> one.load_state_dict(reshard(saved, 1, 0, capacity=8)); len(one)
    5
    """
    order = [oldest_first(s) for s in states]
    keys = list(states[0]["data"]) if states and states[0]["data"] else []
    data = {k: np.concatenate([np.asarray(s["data"][k])[o] for s, o in
                               zip(states, order, strict=True)])[shard::shards][-capacity:]
            for k in keys}
    size = len(next(iter(data.values()))) if data else 0
    out: dict[str, Any] = {"capacity": capacity, "pos": size % capacity, "size": size,
                           "added": size, "data": {k: torch.from_numpy(np.ascontiguousarray(v))
                                                   for k, v in data.items()}}
    if states and "leaves" in states[0]:
        leaves = np.concatenate([np.asarray(s["leaves"], np.float64)[o] for s, o in
                                 zip(states, order, strict=True)])[shard::shards][-capacity:]
        out.update(leaves=torch.from_numpy(leaves.copy()),
                   max_priority=max(float(s["max_priority"]) for s in states))
    return out
