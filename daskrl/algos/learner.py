"""The actor-critic learner: a network differentiated by autograd, stepped by ``torch.optim``.

An update is a plan of minibatches (:meth:`ActorCriticLearner.minibatches`) and, for each,
the loss of :mod:`daskrl.algos.losses` differentiated by autograd, clipped and applied by an
Adam step: the protocol of :class:`~daskrl.algos.gradient_update.GradientUpdate`, which
MAPPO's learner shares.

A network with running statistics (``obs_rms``/``ret_rms``, :mod:`daskrl.algos.normalize`)
is updated on the statistics the actors used; :meth:`~ActorCriticLearner.finish_update` then
merges the batches' moments into them, so the next weights carry the merged statistics.
``data-parallel`` replicas average their moments first (``update_plan().statistics``) and
stay identical.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from daskrl.algos.categorical import DiscreteActorCritic
from daskrl.algos.gradient_update import GradientUpdate
from daskrl.algos.losses import PPO_PARTS
from daskrl.algos.normalize import Moments, from_shifted_sums, merge_all, shifted_sums
from daskrl.algos.offpolicy import adam, load_optimizer_state, optimizer_state
from daskrl.algos.ppo import PPOHyper, _loss, explained_variance
from daskrl.algos.seeding import seeded_init
from daskrl.core.algorithm import Batch, UpdatePlan

Minibatch = dict[str, Tensor]
"""Tensors of one gradient step, on the learner's device."""


def batch_tensors(batches: list[Batch], device: str | torch.device) -> dict[str, Tensor]:
    """The batches' arrays (``stats`` and ``moments`` left out) joined and made tensors on
    ``device``, in their own dtypes (uint8 frames stay uint8 until the network converts them).

    Examples
    --------
    >>> b = {"obs": np.zeros((2, 4), np.float32), "stats": {}}
    >>> batch_tensors([b, b], "cpu")["obs"].shape
    torch.Size([4, 4])
    """
    keys = [k for k in batches[0] if k not in ("stats", "moments")]
    if len(batches) == 1:
        return {k: torch.as_tensor(batches[0][k], device=device) for k in keys}
    return {k: torch.as_tensor(np.concatenate([b[k] for b in batches]), device=device)
            for k in keys}


def shuffled_minibatches(data: dict[str, Tensor], epochs: int, num_minibatches: int,
                         generator: torch.Generator) -> list[Minibatch]:
    """``epochs`` passes over ``data``, each a fresh permutation cut into ``num_minibatches``
    near-equal minibatches (fewer when there are fewer samples).

    Examples
    --------
    >>> data = {"x": torch.arange(6)}
    >>> plan = shuffled_minibatches(data, 2, 3, torch.Generator().manual_seed(0))
    >>> len(plan), sorted(int(i) for mb in plan[:3] for i in mb["x"])
    (6, [0, 1, 2, 3, 4, 5])
    """
    n = len(next(iter(data.values())))
    device = next(iter(data.values())).device
    sizes = [len(c) for c in torch.tensor_split(torch.empty(n), min(num_minibatches, n))]
    plan = []
    for _ in range(epochs):
        perm = torch.randperm(n, generator=generator).to(device)
        shuffled = {k: v[perm] for k, v in data.items()}  # one gather per key and epoch
        start = 0
        for size in sizes:  # minibatches are views of it
            plan.append({k: v[start : start + size] for k, v in shuffled.items()})
            start += size
    return plan


class ActorCriticLearner(GradientUpdate):
    """Actor-critic network and ``torch.optim.Adam`` updated by PPO.

    Parameters
    ----------
    obs_dim, num_actions : int
        Network input size and action count.
    seed : int
        Seeds the initial weights and the minibatch shuffling.
    hidden : tuple of int
        Hidden widths of the actor and critic MLPs.
    hp : PPOHyper, optional
        Update settings.
    device : str
        Where the update runs.
    compile : bool
        Compile each whole gradient step: loss, gradients, clip and Adam step
        (:meth:`~daskrl.algos.gradient_update.GradientUpdate.compile_steps`).
    network : callable, optional
        Builds the network (after seeding); default a :class:`DiscreteActorCritic` of
        ``obs_dim``, ``num_actions``, ``hidden``.
    replicas : int
        Data-parallel replicas whose averaged moments :meth:`minibatches` may be given (the
        average is scaled back by this).

    Examples
    --------
    >>> learner = ActorCriticLearner(4, 2, seed=0)
    >>> sorted(learner.weights())[:2]
    ['actor.0.bias', 'actor.0.weight']
    >>> learner.update_plan()
    UpdatePlan(steps=16, statistics=False)
    """

    def __init__(self, obs_dim: int, num_actions: int, seed: int,
                 hidden: tuple[int, ...] = (64, 64), hp: PPOHyper | None = None,
                 device: str = "cpu", compile: bool = False,
                 network: Callable[[], nn.Module] | None = None, replicas: int = 1) -> None:
        with seeded_init(seed):  # weights from the seed alone (algos.seeding)
            self.hp = hp or PPOHyper()
            self.device = device
            net = network() if network is not None else DiscreteActorCritic(obs_dim, num_actions,
                                                                              hidden)
            self.net = net.to(device)
            self.replicas = replicas
            self.running = {name: rms for name, rms in (("obs", net.obs_rms), ("ret", net.ret_rms))
                            if rms is not None}
            """The network's running statistics, by the ``batch["moments"]`` key they merge."""
            self._pending: dict[str, Moments] = {}
            self.params = [p for p in self.net.parameters() if p.requires_grad]
            self._optimizer: torch.optim.Optimizer | None = None
            self._optimizer_state: dict[str, Any] | None = None
            self.generator = torch.Generator().manual_seed(seed)
            self.loss: Callable[[Minibatch], tuple[Tensor, Tensor]] = self._loss
            if compile:
                self.compile_steps()
            self.parts = PPO_PARTS
            self._weights: dict[str, Tensor] | None = None
            self._data: dict[str, Tensor] | None = None

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        """``torch.optim.Adam`` over :attr:`params` (``eps=1e-5`` as CleanRL), built on first
        use: building one imports ``torch._dynamo`` (about a second), which a learner made
        only for its initial weights (the driver's) never needs. Compiled steps get
        :func:`~daskrl.algos.offpolicy.adam`, fused, or traceable for compiled steps."""
        if self._optimizer is None:
            self._optimizer = adam(self.params, self.learning_rate(0.0), eps=1e-5,
                                   compiled=self.compiled_steps is not None)
            if self._optimizer_state is not None:
                load_optimizer_state(self._optimizer, self._optimizer_state)
                self._optimizer_state = None
        return self._optimizer

    # ------------------------------------------------------------ the loss
    def _loss(self, mb: Minibatch) -> tuple[Tensor, Tensor]:
        """Scalar loss and its parts (stacked in :attr:`parts` order) on one minibatch."""
        return _loss(self.net, mb, self.hp)

    def epochs_and_minibatches(self) -> tuple[int, int]:
        """Passes over a batch and minibatches per pass."""
        return self.hp.update_epochs, self.hp.num_minibatches

    # ------------------------------------------------------- the contract
    def update_plan(self) -> UpdatePlan:
        """Gradient steps per update (the length of every :meth:`minibatches` plan) and
        whether :meth:`statistics` must be merged first.

        Raises
        ------
        ValueError
            With ``target_kl`` set: replicas could stop after different epochs.
        """
        if self.hp.target_kl is not None:
            raise ValueError("data-parallel training needs target_kl=None: replicas would stop "
                             "after different epochs; unset target_kl")
        epochs, num_mb = self.epochs_and_minibatches()
        return UpdatePlan(steps=epochs * num_mb, statistics=bool(self.running))

    def statistics(self, batches: list[Batch]) -> Tensor | None:
        """The batches' observation/return moments as float64 sums around the current running
        means (what replicas can average), or None without running statistics."""
        if not self.running:
            return None
        parts = []
        for name, rms in self.running.items():
            merged = merge_all(b["moments"][name] for b in batches)
            assert merged is not None
            parts.append(shifted_sums(merged, rms.mean.cpu().numpy()))
        return torch.as_tensor(np.concatenate(parts))

    def _merge_later(self, batches: list[Batch], statistics: Tensor | None) -> None:
        """Keep the moments :meth:`finish_update` merges: the batches' own, or the replicas'
        average of :meth:`statistics` scaled back by :attr:`replicas`."""
        if statistics is None:
            self._pending = {name: merged for name in self.running
                             if (merged := merge_all(b["moments"][name] for b in batches))}
            return
        flat, offset = statistics.double().cpu().numpy(), 0
        self._pending = {}
        for name, rms in self.running.items():
            center = rms.mean.cpu().numpy()
            n = 1 + 2 * center.size
            self._pending[name] = from_shifted_sums(flat[offset : offset + n], center,
                                                    self.replicas)
            offset += n

    def minibatches(self, batches: list[Batch], progress: float,
                    statistics: Tensor | None = None) -> list[Minibatch]:
        """Start an update on ``batches``: set the schedules and return its minibatches, in
        the order to step them (shuffled by the learner's seeded generator)."""
        self.schedule(progress)
        self._merge_later(batches, statistics)
        self._data = batch_tensors(batches, self.device)
        epochs, num_mb = self.epochs_and_minibatches()
        return shuffled_minibatches(self._data, epochs, num_mb, self.generator)

    def step_loss(self, minibatch: Minibatch) -> tuple[Tensor, Tensor]:
        """The loss of one minibatch and its parts."""
        return self.loss(minibatch)

    def step_metrics(self, parts: Tensor) -> dict[str, float]:
        """The loss parts, named by :attr:`parts`."""
        return dict(zip(self.parts, parts.tolist(), strict=True))

    def apply_gradients(self, grads: list[Tensor]) -> None:
        """Clip ``grads`` to ``max_grad_norm`` and take an Adam step (the cached weights are
        stale after it)."""
        super().apply_gradients(grads)
        self._weights = None

    def finish_update(self, step_metrics: list[dict[str, float]]) -> dict[str, float]:
        """The update's metrics: mean of each step's, explained variance, learning rate."""
        out = {k: float(np.mean([m[k] for m in step_metrics])) for k in step_metrics[0]}
        if self._data is not None and "values" in self._data:
            out["losses/explained_variance"] = explained_variance(self._data["returns"],
                                                                  self._data["values"])
        out["charts/learning_rate"] = float(self.optimizer.param_groups[0]["lr"])
        if self.compile_s is not None:
            out["compile_s"] = self.compile_s
        self._data = None
        self._weights = None  # the steps changed them
        for name, moments in self._pending.items():  # after the update: the actors used the old
            self.running[name].update(moments)
        self._pending = {}
        return out

    def stop_early(self, step: int, steps: int, metrics: dict[str, float]) -> bool:
        """With ``target_kl`` set: stop at the end of an epoch whose last step's
        approximate KL exceeds it."""
        target_kl = self.hp.target_kl
        per_epoch = max(1, steps // max(1, self.epochs_and_minibatches()[0]))
        return (target_kl is not None and (step + 1) % per_epoch == 0
                and metrics["losses/approx_kl"] > target_kl)

    # ------------------------------------------------------------- state
    def weights(self) -> dict[str, Tensor]:
        """CPU copy of the network weights (one copy per update: treat it as read-only)."""
        if self._weights is None:
            self._weights = {k: v.detach().to("cpu", copy=True)
                             for k, v in self.net.state_dict().items()}
        return self._weights

    def state_dict(self) -> dict[str, Any]:
        """Model, optimiser and shuffling-generator state (CPU)."""
        optim_cpu = self._optimizer_state  # None: no step yet, Adam starts fresh
        if self._optimizer is not None:
            optim_cpu = optimizer_state(self._optimizer)
        return {"model": self.weights(), "optimizer": optim_cpu,
                "generator": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore from :meth:`state_dict`."""
        self._weights = None
        self.net.load_state_dict(state["model"])
        if self._optimizer is not None and state["optimizer"] is not None:
            load_optimizer_state(self._optimizer, state["optimizer"])
        else:  # loaded when the optimiser is built (a fresh one when None)
            self._optimizer, self._optimizer_state = None, state["optimizer"]
        self.generator.set_state(state["generator"])
