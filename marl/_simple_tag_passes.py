"""Which neighbour pass a batched simple tag runs, and how its observations are built.

Environments of up to 32 agents use the *pairs* engine (pair offsets, force sums and, with
full observability, observations as exact matrix products); larger teams the *dense* pass
(all pairs of an environment, chunked over environments); above ``grid_threshold`` agents the
*grid* pass (uniform-grid binning, O(A) work per environment). ``benchmarks/simple_tag.md``
has the measurements behind the thresholds.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from marl._simple_tag_config import SimpleTagConfig
from marl._simple_tag_kernels import PassResult, TagConstants, dense_pass
from marl._simple_tag_obs import ObsLayout, observe
from marl._simple_tag_pairs import PairEngine

__all__ = ["NeighbourPass"]


class NeighbourPass:
    """The contact/neighbour pass of one :class:`~marl.simple_tag.SimpleTag` and its
    observation builder.

    Parameters
    ----------
    constants : TagConstants
        Team sizes, radii and speeds.
    layout : ObsLayout
        Observation layout (``k`` nearest agents / landmarks, widths).
    config : SimpleTagConfig
        ``neighbor_method`` (``"auto"`` picks by team size), ``grid_threshold``,
        ``chunk_elems``, ``compile``, and the neighbour counts.

    Examples
    --------
    >>> from marl.simple_tag import SimpleTag
    >>> SimpleTag(1, num_adversaries=40, num_agent_neighbors=4).neighbor_method
    'dense'
    """

    def __init__(self, constants: TagConstants, layout: ObsLayout,
                 config: SimpleTagConfig) -> None:
        agents = int(constants.is_good.numel())
        method = config.neighbor_method
        if method == "auto":
            method = ("pairs" if agents <= 32 else
                      "dense" if agents <= config.grid_threshold else "grid")
        self.method = method
        self.constants, self.layout = constants, layout
        self.engine = PairEngine(constants, layout) if method == "pairs" else None
        self.pair_obs = (method == "pairs" and config.num_agent_neighbors is None
                         and config.num_landmark_neighbors is None)
        self.run = self._make(method, config)

    def _make(self, method: str, cfg: SimpleTagConfig
              ) -> Callable[[Tensor, Tensor, Tensor], PassResult]:
        c, lay = self.constants, self.layout
        k = lay.k_eff if lay.k is not None else None
        kl = lay.kl_eff if lay.kl is not None else None
        if self.engine is not None:
            fn: Callable[[Tensor, Tensor, Tensor], PassResult] = self.engine.pass_
        elif method == "dense":

            def fn(pos: Tensor, vel: Tensor, lm: Tensor) -> PassResult:
                return dense_pass(pos, lm, c, k, kl, cfg.chunk_elems)

        else:
            from marl._simple_tag_grid import grid_pass

            def fn(pos: Tensor, vel: Tensor, lm: Tensor) -> PassResult:
                return grid_pass(pos, lm, c, k, kl, cfg.chunk_elems)

        if cfg.compile:
            return torch.compile(fn, dynamic=True)
        return fn

    def __call__(self, pos: Tensor, vel: Tensor, lm: Tensor) -> PassResult:
        """Contacts, forces and neighbours of positions ``[E, A, 2]``."""
        return self.run(pos, vel, lm)

    def observe(self, pos: Tensor, vel: Tensor, lm: Tensor, res: PassResult) -> Tensor:
        """Observations ``[E, A, obs_dim]`` after a pass."""
        if self.pair_obs and res.features is not None:
            assert self.engine is not None
            return self.engine.observe(res.features)
        return observe(pos, vel, lm, res, self.constants, self.layout)
