"""Adam over one flat parameter tensor (see :class:`~daskrl.algos.networks.FlatParameters`).

The update is ``torch.optim.Adam``'s (no weight decay, no AMSGrad), step for step; a
small class of its own because creating a ``torch.optim`` optimiser imports
``torch._dynamo`` (seconds per process on a small machine, paid by every worker that
builds a learner), and because one flat tensor needs none of its per-parameter machinery.
"""

from __future__ import annotations

import math
from typing import Any

import torch


class FlatAdam:
    """Adam on a single tensor whose ``.grad`` holds the gradient.

    Parameters
    ----------
    param : torch.Tensor
        The flat parameter tensor (updated in place); its ``.grad`` is read by :meth:`step`.
    lr, betas, eps : float, (float, float), float
        As ``torch.optim.Adam``. ``param_groups[0]["lr"]`` may be changed between steps.

    Examples
    --------
    >>> p = torch.zeros(3); p.grad = torch.tensor([1.0, -2.0, 0.0])
    >>> ref = torch.zeros(3, requires_grad=True); ref.grad = p.grad.clone()
    >>> ours, theirs = FlatAdam(p, lr=0.1), torch.optim.Adam([ref], lr=0.1)
    >>> ours.step(); theirs.step()
    >>> torch.allclose(p, ref.detach())
    True
    """

    def __init__(self, param: torch.Tensor, lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8) -> None:
        self.param = param
        self.param_groups: list[dict[str, Any]] = [
            {"lr": lr, "betas": betas, "eps": eps, "weight_decay": 0, "amsgrad": False,
             "maximize": False, "params": [param]}]
        self.steps = 0
        self.exp_avg = torch.zeros_like(param)
        self.exp_avg_sq = torch.zeros_like(param)

    @torch.no_grad()
    def step(self) -> None:
        """One Adam step with ``param.grad`` (the maths of ``torch.optim.Adam``)."""
        group = self.param_groups[0]
        lr, (beta1, beta2), eps = group["lr"], group["betas"], group["eps"]
        grad = self.param.grad
        self.steps += 1
        self.exp_avg.lerp_(grad, 1 - beta1)
        self.exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        bias_correction1 = 1 - beta1 ** self.steps
        bias_correction2_sqrt = math.sqrt(1 - beta2 ** self.steps)
        denom = (self.exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)
        self.param.addcdiv_(self.exp_avg, denom, value=-lr / bias_correction1)

    def zero_grad(self, set_to_none: bool = False) -> None:
        """Zero the gradient in place (it is the buffer the parameters' gradients view)."""
        if self.param.grad is not None:
            self.param.grad.zero_()

    def state_dict(self) -> dict[str, Any]:
        """State in ``torch.optim``'s layout (``state[0]``: step, exp_avg, exp_avg_sq)."""
        groups = [{k: v for k, v in g.items() if k != "params"} | {"params": [0]}
                  for g in self.param_groups]
        state = {0: {"step": torch.tensor(float(self.steps)), "exp_avg": self.exp_avg,
                     "exp_avg_sq": self.exp_avg_sq}} if self.steps else {}
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore from :meth:`state_dict`.

        Raises
        ------
        ValueError
            If ``state`` holds more than one parameter's state (a per-parameter optimiser's).
        """
        if len(state["state"]) > 1 or len(state["param_groups"]) != 1:
            raise ValueError("optimizer state of another layout (one state per parameter): "
                             "it was saved by an older daskrl; start a new run")
        group = dict(state["param_groups"][0])
        group.pop("params", None)
        self.param_groups[0].update(group)
        saved = next(iter(state["state"].values()), None)
        with torch.no_grad():
            if saved is None:
                self.steps = 0
                self.exp_avg.zero_()
                self.exp_avg_sq.zero_()
            else:
                self.steps = int(saved["step"])
                self.exp_avg.copy_(saved["exp_avg"])
                self.exp_avg_sq.copy_(saved["exp_avg_sq"])
