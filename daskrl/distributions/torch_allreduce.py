"""``data-parallel:allreduce=torch``: gradients all-reduced by ``torch.distributed`` on the workers.

The replicas' workers form one process group per run (gloo on CPU, NCCL when the learner is
on a GPU). Replica 0 starts the group's store on a free port of its host and publishes
``host:port`` in a ``distributed.Variable`` named after the run; the others read it and join.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any
from urllib.parse import urlparse

import torch
import torch.distributed as dist

from daskrl.core.algorithm import Algorithm, LearnerOutput
from daskrl.core.failures import PeerLost
from daskrl.core.roles import TaskContext
from daskrl.distributions.replica import ReplicaUpdate, finish_replica, start_replica

JOIN_TIMEOUT_S = 120.0
"""How long a replica waits for the others to join the process group."""

_GROUP: dict[str, Any] = {}


def ensure_group(run: str, rank: int, world: int, backend: str,
                 who: str = "data-parallel:allreduce=torch") -> None:
    """Join this run's process group (once per worker process and run).

    Rank 0 starts the group's key-value store (``torch.distributed.TCPStore``) on a free
    port of its host first, then publishes ``host:port``, so the others never try to
    connect before it listens (a refused connection is retried only after a back-off).
    ``who`` names the distribution in the error when the others do not come.
    """
    if _GROUP.get("id") == (run, world, backend):
        return
    from distributed import Variable, get_client, get_worker

    if dist.is_initialized():
        dist.destroy_process_group()  # a previous run's group
    var = Variable(f"daskrl-dp-{run}", client=get_client())
    timeout = timedelta(seconds=JOIN_TIMEOUT_S)
    if rank == 0:
        host = urlparse(get_worker().address).hostname or "127.0.0.1"
        store = dist.TCPStore(host, 0, world, True, timeout=timeout, wait_for_workers=False)
        var.set(f"{host}:{store.port}")
    else:
        try:
            address = var.get(timeout=JOIN_TIMEOUT_S)
        except TimeoutError:
            raise RuntimeError(f"{who}: rank 0 did not publish its address within "
                               f"{JOIN_TIMEOUT_S:g}s; are all {world} tasks of the group "
                               "running at once on different workers?") from None
        host, _, port = address.rpartition(":")
        store = dist.TCPStore(host, int(port), world, False, timeout=timeout)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)
    _GROUP["id"] = (run, world, backend)
    _GROUP["store"] = store  # the group uses it for its lifetime


def all_reduce_mean(flat: torch.Tensor, world: int, device: str = "cpu") -> torch.Tensor:
    """The mean of ``flat`` over this process's group: one all-reduce of one flat buffer
    (every gradient of the step, or the batch statistics), summed and divided in place.

    ``flat`` is the round's own tensor (:func:`~daskrl.distributions.replica.flatten` made
    it), so it is overwritten: no second buffer per round. With two replicas the sum is
    ``a + b`` on both (addition commutes exactly), so every replica gets the same bits, and
    the same bits as the Dask path's ``(a + b) / 2``
    (``tests/test_data_parallel_allreduce.py``).
    """
    flat = flat.to(device)
    try:
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    except RuntimeError as exc:  # gloo/NCCL: a replica's worker is gone or hangs
        raise PeerLost(f"data-parallel:allreduce=torch: a replica is gone ({exc})") from None
    return flat.div_(world)


def replica_torch(ctx: TaskContext, algo: Algorithm, learner_in: LearnerOutput,
                  workers: tuple[str, ...]) -> dict[str, Any]:
    """Role ``replica``: roll out and update, gradients all-reduced by ``torch.distributed``."""
    holder, learner, batch = start_replica(ctx, algo, learner_in)
    device = str(learner.device)
    world = len(workers)
    ensure_group(ctx.run, ctx.replica, world, "nccl" if device.startswith("cuda") else "gloo")

    update = ReplicaUpdate(learner, [batch], ctx.progress())
    flat: torch.Tensor | None = update.start()
    while flat is not None:  # the same plan on every replica: the same number of rounds
        flat = update.step(all_reduce_mean(flat, world, device))
    return finish_replica(ctx, holder, update)
