"""The actor-critic learner: a network and a flat Adam, updated by PPO on rollout batches."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from .networks import DiscreteActorCritic, FlatParameters
from .optim import FlatAdam
from .ppo import PPOHyper, ppo_update

GradHook = Callable[[list[torch.Tensor]], None]


class ActorCriticLearner:
    """Actor-critic network and Adam optimiser updated by PPO.

    The parameters are views of one flat tensor (:class:`FlatParameters`) that a
    :class:`FlatAdam` steps; :meth:`weights` is copied once per update and shared with
    :meth:`state_dict` (so a learner task's output carries the weights once).

    Examples
    --------
    >>> learner = ActorCriticLearner(4, 2, seed=0)
    >>> sorted(learner.weights())[:2]
    ['actor.0.bias', 'actor.0.weight']
    >>> learner.gradient_steps()
    16
    """

    def __init__(
        self,
        obs_dim: int,
        num_actions: int,
        seed: int,
        hidden: tuple[int, ...] = (64, 64),
        hp: PPOHyper | None = None,
        device: str = "cpu",
    ) -> None:
        torch.manual_seed(seed)
        self.hp = hp or PPOHyper()
        self.device = device
        self.net = DiscreteActorCritic(obs_dim, num_actions, hidden).to(device)
        # one flat tensor for Adam, gradient clipping and zeroing (see FlatParameters)
        self.flat = FlatParameters(self.net)
        self.optimizer = FlatAdam(self.flat.tensor, lr=self.hp.learning_rate, eps=1e-5)
        self.generator = torch.Generator().manual_seed(seed)
        self._weights: dict[str, torch.Tensor] | None = None

    def update(self, batches: list[dict[str, Any]], progress: float,
               grad_hook: GradHook | None = None) -> dict[str, float]:
        """One PPO update on the concatenated batches (stats are ignored here).

        ``grad_hook`` is called with the parameter gradients after every backward pass
        (data-parallel averaging replaces them in place).
        """
        keys = [k for k in batches[0] if k != "stats"]
        batch = ({k: batches[0][k] for k in keys} if len(batches) == 1
                 else {k: np.concatenate([b[k] for b in batches]) for k in keys})
        lr = self.hp.learning_rate * (1.0 - progress) if self.hp.anneal_lr else None
        self.flat.attach()
        self._weights = None
        metrics = ppo_update(self.net, self.optimizer, batch, self.hp, self.generator, lr=lr,
                             grad_hook=grad_hook, device=self.device)
        metrics["charts/learning_rate"] = self.optimizer.param_groups[0]["lr"]
        return metrics

    def gradient_steps(self) -> int:
        """Backward passes per :meth:`update` (the sync points of data-parallel training).

        Raises
        ------
        ValueError
            With ``target_kl`` set, replicas could stop after different epochs.
        """
        if self.hp.target_kl is not None:
            raise ValueError("data-parallel training needs target_kl=None: replicas would stop "
                             "after different epochs; unset target_kl")
        return self.hp.update_epochs * self.hp.num_minibatches

    def weights(self) -> dict[str, torch.Tensor]:
        """CPU copy of the network weights (one copy per update: treat it as read-only)."""
        if self._weights is None:
            self._weights = {k: v.detach().to("cpu", copy=True)
                             for k, v in self.net.state_dict().items()}
        return self._weights

    def state_dict(self) -> dict[str, Any]:
        """Model, optimiser and shuffling-generator state (CPU)."""
        optim = self.optimizer.state_dict()
        optim_cpu = {
            "param_groups": optim["param_groups"],
            "state": {i: {k: _cpu(v) for k, v in s.items()} for i, s in optim["state"].items()},
        }
        return {"model": self.weights(), "optimizer": optim_cpu,
                "generator": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore from :meth:`state_dict`."""
        self.flat.attach()
        self._weights = None
        self.net.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.generator.set_state(state["generator"])


def _cpu(value: Any) -> Any:
    return value.detach().to("cpu", copy=True) if torch.is_tensor(value) else value
