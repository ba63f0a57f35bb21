"""The algorithms' numerical parts (losses, networks, learners, actors, GAE): no Dask inside.

Replay for off-policy learning lives in modules named for what they do:
:mod:`~daskrl.algos.sum_tree` (the vectorised sum-tree behind prioritised sampling),
:mod:`~daskrl.algos.replay_buffers` (uniform and proportional prioritised buffers, FIFO and
checkpointable; bytes per transition), :mod:`~daskrl.algos.replay_shards` (several shards
as one buffer: merged samples, saved shards dealt over another shard count) and
:mod:`~daskrl.algos.nstep` (folding env steps into ``n``-step transitions on the actor).
"""
