"""``data-parallel:allreduce=torch``: gradients all-reduced by ``torch.distributed`` on the workers.

The replicas' workers form one process group per run (gloo on CPU, NCCL when the learner is
on a GPU). Replica 0 picks a free port on its host and publishes ``tcp://host:port`` in a
``distributed.Variable`` named after the run; the others read it and join.
"""

from __future__ import annotations

import socket
from datetime import timedelta
from typing import Any
from urllib.parse import urlparse

import torch
import torch.distributed as dist

from ..algorithm import Algorithm, LearnerOutput
from ..roles import TaskContext
from .data_parallel import _finish, _start, unflatten_into

JOIN_TIMEOUT_S = 120.0
"""How long a replica waits for the others to join the process group."""

_GROUP: dict[str, Any] = {}


def free_port(host: str) -> int:
    """A TCP port that is free on ``host`` right now.

    Examples
    --------
    >>> 0 < free_port("127.0.0.1") < 65536
    True
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def ensure_group(run: str, rank: int, world: int, backend: str) -> None:
    """Join this run's process group (once per worker process and run)."""
    if _GROUP.get("id") == (run, world, backend):
        return
    from distributed import Variable, get_client, get_worker

    if dist.is_initialized():
        dist.destroy_process_group()  # a previous run's group
    var = Variable(f"daskrl-dp-{run}", client=get_client())
    if rank == 0:
        host = urlparse(get_worker().address).hostname or "127.0.0.1"
        var.set(f"tcp://{host}:{free_port(host)}")
    try:
        address = var.get(timeout=JOIN_TIMEOUT_S)
    except TimeoutError:
        raise RuntimeError(f"data-parallel:allreduce=torch: replica 0 did not publish its "
                           f"address within {JOIN_TIMEOUT_S:g}s; are all {world} replicas "
                           "running at once on different workers?") from None
    dist.init_process_group(backend, init_method=address, rank=rank, world_size=world,
                            timeout=timedelta(seconds=JOIN_TIMEOUT_S))
    _GROUP["id"] = (run, world, backend)


def replica_torch(ctx: TaskContext, algo: Algorithm, learner_in: LearnerOutput,
                  workers: tuple[str, ...]) -> dict[str, Any]:
    """Role ``replica``: roll out and update, gradients all-reduced by ``torch.distributed``."""
    holder, learner, batch = _start(ctx, algo, learner_in)
    device = str(getattr(learner, "device", "cpu"))
    world = len(workers)
    ensure_group(ctx.run, ctx.replica, world, "nccl" if device.startswith("cuda") else "gloo")

    def average(grads: list[torch.Tensor]) -> None:
        flat = torch.cat([g.detach().reshape(-1) for g in grads])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        unflatten_into(flat / world, grads)

    metrics = learner.update([batch], ctx.iteration / ctx.num_iterations, grad_hook=average)
    return _finish(ctx, holder, metrics)
