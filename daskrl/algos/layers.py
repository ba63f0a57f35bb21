"""Layers the actor-critic heads are built from (CleanRL's layouts and orthogonal init): MLPs,
and the Nature-DQN CNN torso that takes uint8 frames."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn
from torch.nn import functional as F


def layer(n_in: int, n_out: int, std: float = math.sqrt(2), bias: float = 0.0) -> nn.Linear:
    """A linear layer with orthogonal weights and constant bias.

    Examples
    --------
    >>> layer(4, 8).weight.shape
    torch.Size([8, 4])
    """
    lin = nn.Linear(n_in, n_out)
    nn.init.orthogonal_(lin.weight, std)
    nn.init.constant_(lin.bias, bias)
    return lin


def mlp(n_in: int, n_out: int, hidden: tuple[int, ...], out_std: float) -> nn.Sequential:
    """A tanh MLP ending in a linear head initialised with ``out_std``.

    Examples
    --------
    >>> mlp(4, 2, (8,), out_std=0.01)
    Sequential(
      (0): Linear(in_features=4, out_features=8, bias=True)
      (1): Tanh()
      (2): Linear(in_features=8, out_features=2, bias=True)
    )
    """
    layers: list[nn.Module] = []
    for h in hidden:
        layers += [layer(n_in, h), nn.Tanh()]
        n_in = h
    layers.append(layer(n_in, n_out, std=out_std))
    return nn.Sequential(*layers)


def run_mlp(net: nn.Sequential, x: Tensor) -> Tensor:
    """``net(x)`` for a Sequential of ``Linear``, ``Tanh`` and ``ReLU`` layers, called as
    functions.

    The same ops as ``net(x)`` (``F.linear``, ``torch.tanh``, ``torch.relu``), so the same
    bits, without ``nn.Module.__call__``'s hook dispatch per layer: on an actor's one-env
    forward pass, or a learner's hundreds of small-batch passes per iteration, that dispatch
    costs about as much as the maths.

    Examples
    --------
    >>> net = mlp(4, 2, (8,), out_std=1.0)
    >>> x = torch.randn(3, 4)
    >>> torch.equal(run_mlp(net, x), net(x))
    True
    """
    for module in net:
        if isinstance(module, nn.Linear):
            x = F.linear(x, module.weight, module.bias)
        elif isinstance(module, nn.Tanh):
            x = torch.tanh(x)
        elif isinstance(module, nn.ReLU):
            x = torch.relu(x)
        else:
            x = module(x)
    return x



class ScaleBytes(nn.Module):
    """uint8 pixels to float32 in [0, 1], inside the network: frames stay uint8 (4x smaller)
    until they reach the device that runs it."""

    def forward(self, x: Tensor) -> Tensor:
        """``x / 255`` as float32."""
        return x.to(torch.float32) / 255.0


def conv(n_in: int, n_out: int, kernel: int, stride: int, padding: int = 0) -> nn.Conv2d:
    """A convolution with orthogonal weights (gain sqrt 2) and zero bias (``padding`` zeros
    around the input).

    Examples
    --------
    >>> conv(4, 32, 8, 4).weight.shape
    torch.Size([32, 4, 8, 8])
    """
    c = nn.Conv2d(n_in, n_out, kernel, stride, padding=padding)
    nn.init.orthogonal_(c.weight, math.sqrt(2))
    nn.init.constant_(c.bias, 0.0)
    return c


def nature_cnn(in_channels: int, size: int = 84) -> nn.Sequential:
    """The Nature-DQN torso: uint8 frames ``(B, in_channels, size, size)`` in, 512 features
    out (scaled by 1/255 inside, so callers pass the frames as they are).

    Examples
    --------
    >>> nature_cnn(4)(torch.zeros(2, 4, 84, 84, dtype=torch.uint8)).shape
    torch.Size([2, 512])
    """
    convs = nn.Sequential(ScaleBytes(), conv(in_channels, 32, 8, 4), nn.ReLU(),
                          conv(32, 64, 4, 2), nn.ReLU(), conv(64, 64, 3, 1), nn.ReLU(),
                          nn.Flatten())
    with torch.no_grad():
        flat = convs(torch.zeros(1, in_channels, size, size)).shape[1]
    return nn.Sequential(*convs, layer(flat, 512), nn.ReLU())
