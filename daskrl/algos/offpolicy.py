"""What every off-policy learner here shares to keep its gradient steps cheap.

On a CPU a gradient step of a small MLP costs a few hundred microseconds, most of it the
fixed cost of each torch call, not arithmetic; an iteration takes a hundred or more of
them. So: the minibatches of a whole iteration come from the replay in one vectorised
sample and become tensors once (:func:`minibatches`); optimisers are fused (:func:`adam`:
one kernel for all parameters, not ~10 calls per parameter); target networks move with
one call for all their tensors (:func:`polyak_`); losses are summed as tensors and read
once per iteration (:class:`TensorMeans`), never with a host sync per step.
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from daskrl.algos.compiled_step import compilable_adam


def adam(params: Iterable[Tensor], lr: float, eps: float = 1e-8,
         compiled: bool = False) -> torch.optim.Adam:
    """Adam whose step is one fused kernel over every parameter (CPU and CUDA), or with
    ``compiled`` one a compiled step traces
    (:func:`~daskrl.algos.compiled_step.compilable_adam`).

    Examples
    --------
    >>> adam(torch.nn.Linear(2, 1).parameters(), 1e-3).defaults["fused"]
    True
    """
    if compiled:
        return compilable_adam(params, lr, eps)
    return torch.optim.Adam(params, lr=lr, eps=eps, fused=True)


def polyak_(target: Iterable[Tensor], source: Iterable[Tensor], tau: float) -> None:
    """Move every ``target`` tensor towards its ``source`` by ``tau`` (``tau >= 1``: copy),
    all tensors in one call.

    Examples
    --------
    >>> t, s = [torch.zeros(2)], [torch.ones(2)]
    >>> polyak_(t, s, 0.25); t[0].tolist()
    [0.25, 0.25]
    >>> polyak_(t, s, 1.0); t[0].tolist()
    [1.0, 1.0]
    """
    targets, sources = list(target), list(source)
    with torch.no_grad():
        if tau >= 1:
            torch._foreach_copy_(targets, sources)
        else:
            torch._foreach_lerp_(targets, sources, tau)


def cpu_copy(module: torch.nn.Module) -> dict[str, Tensor]:
    """A CPU copy of ``module``'s state dict (for a learner's weights and state: the live
    tensors change in place at the next step).

    Examples
    --------
    >>> sorted(cpu_copy(torch.nn.Linear(2, 1)))
    ['bias', 'weight']
    """
    return {k: v.detach().cpu().clone() for k, v in module.state_dict().items()}


def optimizer_state(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """A CPU copy of ``optimizer.state_dict()``, for a learner's state.

    Why a copy: torch's holds the live moment tensors, which the next step changes in place,
    while the learner output that carries them may still wait on its worker to be sent (to
    the driver, into a checkpoint). Why CPU: a checkpoint of a GPU learner must load on a
    machine without one (``load_state_dict`` moves the moments back to the parameters'
    device).

    Examples
    --------
    >>> opt = adam(torch.nn.Linear(2, 1).parameters(), 1e-3)
    >>> opt.state_dict()["param_groups"] == optimizer_state(opt)["param_groups"]
    True
    """
    state = optimizer.state_dict()
    groups = copy.deepcopy(state["param_groups"])
    for group in groups:  # a compiled step's tensor rate saved as the float it holds
        if torch.is_tensor(group["lr"]):
            group["lr"] = float(group["lr"])
    return {"param_groups": groups,
            "state": {i: {k: v.detach().to("cpu", copy=True) if torch.is_tensor(v) else v
                          for k, v in s.items()} for i, s in state["state"].items()}}


def load_optimizer_state(optimizer: torch.optim.Optimizer, state: Mapping[str, Any]) -> None:
    """``optimizer.load_state_dict(state)``, keeping how ``optimizer`` steps.

    torch's loader takes every setting of the saved parameter groups, the kernel flags
    (``fused``, ``foreach``, ``capturable``) too, and a float learning rate over a tensor
    one; a state saved by an eager learner (fused Adam) would then make a compiled one's
    step untraceable, and the reverse. The saved moments, step counts and rates are loaded
    (copied: torch's loader keeps the given tensors where their device and type fit, and the
    steps would then change ``state`` in place, for whoever else holds it); the flags and
    the kind of rate stay this optimiser's.

    Examples
    --------
    >>> net = torch.nn.Linear(2, 1)
    >>> eager, compiled = adam(net.parameters(), 1e-3), compilable_adam(net.parameters(), 1.0)
    >>> load_optimizer_state(compiled, optimizer_state(eager))
    >>> group = compiled.param_groups[0]
    >>> torch.is_tensor(group["lr"]), float(group["lr"]), group["fused"]
    (True, 0.001, None)
    """
    flags = ("fused", "foreach", "capturable")
    own = [({k: g[k] for k in flags if k in g}, g["lr"]) for g in optimizer.param_groups]
    # this optimiser's flags before loading: torch places the step counts by them
    groups = [{**saved, **kept} for saved, (kept, _) in zip(state["param_groups"], own,
                                                            strict=True)]
    optimizer.load_state_dict({
        "param_groups": groups,
        "state": {i: {k: v.clone() if torch.is_tensor(v) else v for k, v in s.items()}
                  for i, s in state["state"].items()}})
    for group, (_, lr) in zip(optimizer.param_groups, own, strict=True):
        if torch.is_tensor(lr):
            lr.fill_(float(group["lr"]))
            group["lr"] = lr


def restore_replay(replay: Any, state: Mapping[str, Any]) -> int:
    """Load the replay of a learner ``state`` into ``replay``; return the transitions lost.

    A state without the replay's contents leaves ``replay`` as it is: a learner that still
    holds its buffer (it went back a few updates after another worker was lost) keeps it;
    an empty one (a new learner) restarts empty and says why in one line: the state was
    saved with ``--no-save-replay``, or it is a light state
    (:meth:`~daskrl.core.algorithm.LightStateLearner.light_state_dict`) that a learner was
    rebuilt from between checkpoints (its worker lost).

    Examples
    --------
    >>> import numpy as np
    >>> from daskrl.algos.replay_buffers import ReplayBuffer
    >>> held = ReplayBuffer(4); held.add({"x": np.zeros(3)})
    >>> restore_replay(held, {"replay_size": 3, "light": True}), len(held)
    (0, 3)
    >>> restore_replay(ReplayBuffer(4), {"replay_size": 3, "light": True})
    3
    """
    if "replay" in state:
        replay.load_state_dict(state["replay"])
        return 0
    if len(replay):
        return 0
    lost = int(state.get("replay_size", 0))
    if lost and state.get("light"):
        print(f"daskrl: this learner state was taken between checkpoints and holds no "
              f"replay (a lost learner worker, or a run stopped between checkpoints): the "
              f"buffer restarts empty, {lost} transitions lost (replay_lost in the metrics; "
              "the --checkpoint-every checkpoints hold the replay)", file=sys.stderr)
    elif lost:
        print(f"daskrl: the replay buffer was not saved (--no-save-replay): it restarts "
              f"empty, {lost} transitions lost", file=sys.stderr)
    return lost


def minibatches(replay: Any, steps: int, batch_size: int, fields: Sequence[str],
                device: str | torch.device = "cpu") -> dict[str, Tensor]:
    """``steps`` minibatches of ``batch_size`` transitions drawn uniformly from ``replay`` in
    one call, as tensors ``[steps, batch_size, ...]`` on ``device``.

    Every minibatch is drawn from the same contents, as when drawn one by one between
    gradient steps: a uniform buffer does not change while the learner trains.

    Examples
    --------
    >>> from daskrl.algos.replay_buffers import ReplayBuffer
    >>> buf = ReplayBuffer(10)
    >>> buf.add({"obs": np.zeros((10, 3), np.float32), "rewards": np.ones(10, np.float32)})
    >>> mb = minibatches(buf, 4, 2, ("obs", "rewards"))
    >>> mb["obs"].shape, mb["rewards"].shape
    (torch.Size([4, 2, 3]), torch.Size([4, 2]))
    """
    sample = replay.sample(steps * batch_size)
    return as_tensors(sample, fields, device, (steps, batch_size))


def as_tensors(sample: Mapping[str, Any], fields: Sequence[str],
               device: str | torch.device = "cpu", lead: tuple[int, ...] | None = None
               ) -> dict[str, Tensor]:
    """``sample``'s ``fields`` as tensors on ``device`` (floating arrays as float32), their
    first dimension reshaped to ``lead`` when given.

    Examples
    --------
    >>> as_tensors({"r": np.zeros(6)}, ("r",), lead=(2, 3))["r"].dtype
    torch.float32
    """
    out = {}
    for key in fields:
        value = torch.as_tensor(np.asarray(sample[key]), device=device)
        if value.is_floating_point():
            value = value.float()
        out[key] = value if lead is None else value.reshape(*lead, *value.shape[1:])
    return out


class TensorMeans:
    """Tensors (losses, Q values; those of one key all of one shape) kept as tensors and
    averaged once, as floats.

    Adding is a list append (no host sync, no torch call), so a GPU learner never waits for
    its device between gradient steps to record a metric.

    Examples
    --------
    >>> m = TensorMeans()
    >>> m.add("loss", torch.tensor(1.0)); m.add("loss", torch.tensor(3.0))
    >>> m.means()
    {'loss': 2.0}
    """

    def __init__(self) -> None:
        self.values: dict[str, list[Tensor]] = {}

    def add(self, key: str, value: Tensor) -> None:
        """Keep ``value`` (detached) under ``key``."""
        self.values.setdefault(key, []).append(value.detach())

    def means(self) -> dict[str, float]:
        """Each key's mean, as floats (one transfer for all of them)."""
        if not self.values:
            return {}
        keys = sorted(self.values)
        means = torch.stack([torch.stack(self.values[k]).float().mean() for k in keys])
        return dict(zip(keys, means.cpu().tolist(), strict=True))
