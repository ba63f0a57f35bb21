"""Replay for off-policy learning, in three modules named for what they do; this module
gathers their public names so callers import them from one place.

- :mod:`daskrl.algos.sum_tree`: the vectorised sum-tree behind prioritised sampling;
- :mod:`daskrl.algos.replay_buffers`: uniform and proportional prioritised buffers (FIFO,
  checkpointable), bytes per transition;
- :mod:`daskrl.algos.replay_shards`: several shards as one buffer (merged samples, saved
  shards dealt over another shard count);
- :mod:`daskrl.algos.nstep`: folding env steps into ``n``-step transitions on the actor.
"""

from __future__ import annotations

from daskrl.algos.nstep import concat_steps, nstep_transitions
from daskrl.algos.replay_buffers import (
    FIELDS,
    Batch,
    PrioritizedReplay,
    ReplayBuffer,
    importance_weights,
    make_replay,
    transition_nbytes,
)
from daskrl.algos.replay_shards import merge_samples, oldest_first, reshard
from daskrl.algos.sum_tree import SumTree

__all__ = ["FIELDS", "Batch", "PrioritizedReplay", "ReplayBuffer", "SumTree", "concat_steps",
           "importance_weights", "make_replay", "merge_samples", "nstep_transitions",
           "oldest_first", "reshard", "transition_nbytes"]
