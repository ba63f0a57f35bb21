"""Several MLPs of one shape evaluated as one: the members' weights stacked layer by layer,
one batched matrix product (``torch.baddbmm``) per layer for all members.

SAC's twin critics, TD3's, an ensemble of Q-networks or dynamics models: each member's
forward and backward pass is a handful of small kernels, and on a CPU (or a GPU at small
batch) their fixed cost per call is a large share of a gradient step. Stacked, the members
take one kernel where they took ``N``, forward and backward, and their optimiser and target
updates see ``N`` times fewer tensors. The maths per member is unchanged: the same products,
summed in another order (equal to a float32 rounding, tested against the members run one by
one).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn


class StackedMLP(nn.Module):
    """``len(members)`` ReLU MLPs (``nn.Sequential`` of ``Linear`` and ``ReLU``, all of one
    shape) as one module with stacked parameters.

    ``weights[i]`` is ``[N, in, out]`` (each member's ``Linear.weight`` transposed) and
    ``biases[i]`` ``[N, 1, out]``: layer ``i`` of every member is one ``baddbmm``. Built
    from the members, so they keep their own initialisation.

    Examples
    --------
    >>> _ = torch.manual_seed(0)
    >>> members = [nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 1)) for _ in range(2)]
    >>> stacked = StackedMLP(members)
    >>> x = torch.randn(5, 3)
    >>> out = stacked(x)
    >>> out.shape
    torch.Size([2, 5, 1])
    >>> torch.allclose(out[1], members[1](x), atol=1e-6)
    True
    """

    def __init__(self, members: Sequence[nn.Sequential]) -> None:
        super().__init__()
        if not members:
            raise ValueError("StackedMLP needs at least one member")
        layers = [_linears(m) for m in members]
        shapes = {tuple(lin.weight.shape for lin in ls) for ls in layers}
        if len(shapes) != 1:
            raise ValueError(f"StackedMLP: the members differ in shape {sorted(shapes)}; "
                             "stack MLPs of one shape only")
        self.members = len(members)
        with torch.no_grad():
            self.weights = nn.ParameterList(
                nn.Parameter(torch.stack([ls[i].weight.t() for ls in layers]).contiguous())
                for i in range(len(layers[0])))
            self.biases = nn.ParameterList(
                nn.Parameter(torch.stack([ls[i].bias for ls in layers]).unsqueeze(1).clone())
                for i in range(len(layers[0])))

    def forward(self, x: Tensor) -> Tensor:
        """Every member on ``x``: ``[B, in]`` (the same input for all) or ``[N, B, in]`` (one
        per member); returns ``[N, B, out]``."""
        h = x if x.dim() == 3 else x.unsqueeze(0).expand(self.members, *x.shape)
        last = len(self.weights) - 1
        for i, (w, b) in enumerate(zip(self.weights, self.biases, strict=True)):
            h = torch.baddbmm(b, h, w)
            if i < last:
                h = torch.relu(h)
        return h

    def unstacked(self) -> list[nn.Sequential]:
        """The members as plain ``nn.Sequential`` modules with copies of their weights.

        Examples
        --------
        >>> s = StackedMLP([nn.Sequential(nn.Linear(2, 4), nn.ReLU(), nn.Linear(4, 1))] * 2)
        >>> [type(m[0]).__name__ for m in s.unstacked()]
        ['Linear', 'Linear']
        """
        out = []
        for j in range(self.members):
            layers: list[nn.Module] = []
            for i, (w, b) in enumerate(zip(self.weights, self.biases, strict=True)):
                lin = nn.Linear(w.shape[1], w.shape[2])
                with torch.no_grad():
                    lin.weight.copy_(w[j].t())
                    lin.bias.copy_(b[j, 0])
                layers += [lin] if i == len(self.weights) - 1 else [lin, nn.ReLU()]
            out.append(nn.Sequential(*layers))
        return out


def _linears(member: nn.Sequential) -> list[nn.Linear]:
    """The ``Linear`` layers of a ReLU MLP; one line naming any other layer."""
    kinds = [type(m).__name__ for m in member]
    expected = ["Linear" if i % 2 == 0 else "ReLU" for i in range(len(kinds))]
    if kinds != expected or kinds[-1] != "Linear":
        raise ValueError(f"StackedMLP stacks Linear/ReLU MLPs ending in a Linear, got {kinds}")
    return [m for m in member if isinstance(m, nn.Linear)]
