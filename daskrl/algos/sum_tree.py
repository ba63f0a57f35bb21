"""A sum-tree over priorities: sampling in proportion to them and updating them for a whole
batch at once (vectorised numpy, one tree level per step, never one sample at a time)."""

from __future__ import annotations

import numpy as np


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
