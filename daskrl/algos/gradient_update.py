"""The update protocol every learner of the PPO family shares (PPO, A2C, V-trace, MAPPO).

An update is a plan of minibatches; each minibatch's loss is differentiated by autograd
(:meth:`GradientUpdate.compute_gradients`), its gradients clipped by ``clip_grad_norm_`` and
applied by a ``torch.optim`` step (:meth:`GradientUpdate.apply_gradients`).
:meth:`GradientUpdate.update` runs the plan in turn; ``data-parallel`` runs the same plan on
every replica and averages the gradients between compute and apply
(:class:`~daskrl.core.contracts.GradientLearner`).

A learner says what it trains on and how: :meth:`~GradientUpdate.minibatches` (the plan,
its statistics folded in), :meth:`~GradientUpdate.step_loss` (the scalar loss and its parts
of one minibatch), :meth:`~GradientUpdate.step_metrics` (the parts named),
:meth:`~GradientUpdate.finish_update`, and optionally :meth:`~GradientUpdate.clip_groups`
(parameters clipped together) and :meth:`~GradientUpdate.stop_early`.

With :meth:`GradientUpdate.compile_steps` a whole gradient step (the loss, its gradients,
the clip and the optimiser step) is one compiled function
(:class:`~daskrl.algos.compiled_step.CompiledStep`); its optimiser is then
:func:`~daskrl.algos.compiled_step.compilable_adam`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from daskrl.algos.compiled_step import CompiledStep, compile_seconds


def annealed_lr(base: float, anneal: bool, progress: float) -> float:
    """The learning rate at ``progress`` in [0, 1] of the run: ``base``, or with ``anneal``
    ``base`` falling linearly to 0 over the run.

    Examples
    --------
    >>> annealed_lr(1e-3, True, 0.25), annealed_lr(1e-3, False, 0.25)
    (0.00075, 0.001)
    """
    return base * (1.0 - progress) if anneal else base


def set_learning_rate(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Give every parameter group of ``optimizer`` the step size ``lr`` (in place where it
    is a tensor, as a compiled step reads it: a float would be a constant of the graph).

    Examples
    --------
    >>> from daskrl.algos.compiled_step import compilable_adam
    >>> opt = compilable_adam(torch.nn.Linear(2, 1).parameters(), 1e-3)
    >>> set_learning_rate(opt, 5e-4); float(opt.param_groups[0]["lr"])
    0.0005
    """
    for group in optimizer.param_groups:
        if isinstance(group["lr"], Tensor):
            group["lr"].fill_(lr)
        else:
            group["lr"] = lr


def clipped_step(optimizer: torch.optim.Optimizer, params: list[Tensor],
                 grads: Sequence[Tensor], groups: list[list[Tensor]], max_norm: float) -> None:
    """Give ``params`` their ``grads``, clip each of ``groups`` to ``max_norm`` (one call per
    group) and take one ``optimizer`` step: every learner's step after its gradients, eager
    or compiled.

    Examples
    --------
    >>> w = torch.nn.Parameter(torch.zeros(2))
    >>> opt = torch.optim.SGD([w], lr=1.0)
    >>> clipped_step(opt, [w], [torch.tensor([3.0, 4.0])], [[w]], max_norm=1.0)
    >>> [round(v, 3) for v in w.tolist()]
    [-0.6, -0.8]
    """
    for p, g in zip(params, grads, strict=True):
        p.grad = g.to(p.device)
    for group in groups:
        torch.nn.utils.clip_grad_norm_(group, max_norm, foreach=True)
    optimizer.step()


class GradientUpdate(ABC):
    """Schedules, autograd gradients, clipped optimiser steps and the update loop.

    A subclass holds ``params`` (the trained parameters, in the order gradients come),
    ``optimizer`` (over them), ``hp`` (with ``learning_rate``, ``anneal_lr`` and
    ``max_grad_norm``).

    Examples
    --------
    One linear layer fitted to a target by the protocol:

    >>> class Fit(GradientUpdate):
    ...     def __init__(self):
    ...         from daskrl.algos.ppo import PPOHyper
    ...         torch.manual_seed(0)
    ...         self.hp, self.net = PPOHyper(learning_rate=0.1), torch.nn.Linear(1, 1)
    ...         self.params = list(self.net.parameters())
    ...         self.optimizer = torch.optim.SGD(self.params, lr=0.1)
    ...     def minibatches(self, batches, progress, statistics=None):
    ...         self.schedule(progress)
    ...         return [torch.ones(4, 1)] * 50
    ...     def step_loss(self, x):
    ...         loss = ((self.net(x) - 3.0) ** 2).mean()
    ...         return loss, loss.detach().reshape(1)
    ...     def step_metrics(self, parts):
    ...         return {"loss": float(parts[0])}
    ...     def finish_update(self, steps):
    ...         return steps[-1]
    >>> round(Fit().update([], 0.0)["loss"], 4)
    0.0
    """

    params: list[Tensor]
    optimizer: torch.optim.Optimizer
    hp: Any
    compiled_steps: dict[str, CompiledStep] | None = None
    """The compiled step functions, set by :meth:`compile_steps` (None: eager)."""

    # ----------------------------------------------------------- what a learner says
    @abstractmethod
    def minibatches(self, batches: list[Any], progress: float,
                    statistics: Tensor | None = None) -> list[Any]:
        """Start an update: set the schedules, fold in ``statistics``, return the plan."""

    @abstractmethod
    def step_loss(self, minibatch: Any) -> tuple[Tensor, Tensor]:
        """The scalar loss of ``minibatch`` and its parts (detached)."""

    @abstractmethod
    def step_metrics(self, parts: Tensor) -> dict[str, float]:
        """The parts of :meth:`step_loss` as named metrics."""

    @abstractmethod
    def finish_update(self, step_metrics: list[dict[str, float]]) -> dict[str, float]:
        """End the update begun by :meth:`minibatches`; its metrics from each step's."""

    def clip_groups(self) -> list[list[Tensor]]:
        """Parameters whose gradient norm is clipped together (default: all of them)."""
        return [self.params]

    def stop_early(self, step: int, steps: int, metrics: dict[str, float]) -> bool:
        """Whether the update stops after ``step`` (0-based) of ``steps`` (default: never)."""
        return False

    # ----------------------------------------------------------- what they share
    def learning_rate(self, progress: float) -> float:
        """The learning rate at ``progress`` in [0, 1] of the run (annealed linearly to 0
        when ``hp.anneal_lr``)."""
        return annealed_lr(self.hp.learning_rate, self.hp.anneal_lr, progress)

    def schedule(self, progress: float) -> dict[str, float]:
        """Set the optimiser's learning rate for ``progress``; return it."""
        lr = self.learning_rate(progress)
        set_learning_rate(self.optimizer, lr)
        return {"charts/learning_rate": lr}

    def compile_steps(self) -> None:
        """Compile the gradient step: :meth:`train_step` (the loss, ``torch.autograd.grad``,
        the clip and the optimiser step) as one function, and the two halves data-parallel
        replicas call apart (:meth:`compute_gradients`, :meth:`apply_gradients`); see
        :mod:`daskrl.algos.compiled_step`. Call it before the optimiser is built: that must
        be :func:`~daskrl.algos.compiled_step.compilable_adam`."""
        self.compiled_steps = {"step": CompiledStep(self._whole_step, batch_varies=True),
                               "grads": CompiledStep(self._loss_and_grads, batch_varies=True),
                               "apply": CompiledStep(self._clip_and_step)}

    @property
    def compile_s(self) -> float | None:
        """Seconds spent compiling in this process so far (None when eager; see
        :func:`~daskrl.algos.compiled_step.compile_seconds`)."""
        return None if self.compiled_steps is None else compile_seconds()

    def _call(self, name: str, eager: Any, *args: Any) -> Any:
        """``eager(*args)``, or its compiled twin after :meth:`compile_steps`."""
        if self.compiled_steps is None:
            return eager(*args)
        return self.compiled_steps[name](*args)

    def _loss_and_grads(self, minibatch: Any) -> tuple[tuple[Tensor, ...], Tensor]:
        loss, parts = self.step_loss(minibatch)
        return torch.autograd.grad(loss, self.params), parts

    def _clip_and_step(self, grads: list[Tensor]) -> None:
        clipped_step(self.optimizer, self.params, grads, self.clip_groups(),
                     self.hp.max_grad_norm)

    def _whole_step(self, minibatch: Any) -> Tensor:
        grads, parts = self._loss_and_grads(minibatch)
        self._clip_and_step(list(grads))
        return parts

    def compute_gradients(self, minibatch: Any) -> tuple[list[Tensor], dict[str, float]]:
        """The loss gradient of every parameter (autograd), and the loss parts."""
        grads, parts = self._call("grads", self._loss_and_grads, minibatch)
        return list(grads), self.step_metrics(parts)

    def apply_gradients(self, grads: list[Tensor]) -> None:
        """Clip ``grads`` (each of :meth:`clip_groups` to ``hp.max_grad_norm``) and take one
        optimiser step."""
        if len(grads) != len(self.params):
            raise ValueError(f"got {len(grads)} gradients for {len(self.params)} parameters")
        self._call("apply", self._clip_and_step, list(grads))

    def train_step(self, minibatch: Any) -> dict[str, float]:
        """One gradient step on ``minibatch``: the work of :meth:`compute_gradients` then
        :meth:`apply_gradients` (without calling them), one compiled function after
        :meth:`compile_steps`; return the loss parts named."""
        return self.step_metrics(self._call("step", self._whole_step, minibatch))

    def update(self, batches: list[Any], progress: float) -> dict[str, float]:
        """One update: every minibatch of the plan stepped in turn (:meth:`train_step`),
        until :meth:`stop_early` says stop."""
        plan = self.minibatches(batches, progress)
        done: list[dict[str, float]] = []
        for i, mb in enumerate(plan):
            metrics = self.train_step(mb)
            done.append(metrics)
            if self.stop_early(i, len(plan), metrics):
                break
        return self.finish_update(done)
