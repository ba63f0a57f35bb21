"""Multi-agent environments with a batched, tensor-first interface.

* :class:`marl.simple_tag.SimpleTag`: predator-prey simple tag, all agents of all
  environments in one torch state, exact to ``mpe2.simple_tag_v3``.
* :mod:`marl.pettingzoo`: a PettingZoo ``ParallelEnv`` view of the batched
  simple tag, and :class:`marl.pettingzoo.PettingZooBatchEnv`, which gives any
  PettingZoo parallel environment the same batched interface.
"""

from marl.simple_tag import SimpleTag, SimpleTagConfig, SimpleTagState

__all__ = ["SimpleTag", "SimpleTagConfig", "SimpleTagState"]
