"""The board games' policy-value networks: a categorical policy over legal moves and a
state value, from flat observations (:func:`marl.board_game.flat_observation`: the planes,
then the action mask), with an MLP, a convolutional or a fully convolutional torso; and a
network as a player of :func:`marl.board_game.play_games`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor, nn

from daskrl.algos.networks import conv, layer, mlp
from marl.board_game import Player


def masked_logits(logits: Tensor, mask: Tensor) -> Tensor:
    """``logits`` with illegal moves (mask 0) pushed to the dtype's lowest value."""
    return logits.masked_fill(mask < 0.5, torch.finfo(logits.dtype).min)


FCN_LAYERS = 4
"""3x3 convolutions of the ``fcn`` torso: each cell sees the 9x9 around it, every line of
four through it included."""


class MaskedActorCritic(nn.Module):
    """Categorical policy over legal moves and a state value, from flat observations whose
    last ``num_actions`` entries are the action mask.

    ``torso="mlp"``: separate actor and critic MLPs over the flattened planes (as PPO's discrete
    head). ``torso="conv"``: a shared convolutional torso over the board (two 3x3 convolutions,
    a 1x1 one down to 8 channels, then a hidden layer), which sees a line of pieces wherever it
    lies on the board. ``torso="fcn"`` (fully convolutional, with ``cells``, a
    :attr:`~marl.board_game.GameShape.cells`): :data:`FCN_LAYERS` 3x3 convolutions over the
    planes and a plane of ones (so the board's edge differs from an empty cell), then a score
    for each cell; a move's logit is the sum of the scores of its empty cells (a column's, in
    Connect Four); the value is the mlp torso's critic. A line of four through a cell lies
    inside the cell's 9x9 view, and the same filters look at every cell, so a winning or
    blocking cell learned in one place is recognised in others (``benchmarks/board_tactics.py``
    compares the torsos on Connect Four's tactics). With ``mirror`` (a
    :attr:`~marl.board_game.GameShape.mirror`) the network is symmetric by construction: logits
    and value are the means over the position and its left-right mirror image, each move's logit
    taken from its mirror move's, so what it learns of a line on one side holds on the other. It
    offers what :class:`daskrl.algos.networks.ActorCritic` promises, so PPO's learner
    (:class:`daskrl.algos.learner.ActorCriticLearner`) trains it as it is.

    Examples
    --------
    >>> net = MaskedActorCritic((3, 3, 2), 9)
    >>> obs = np.zeros((2, 27), np.float32); obs[:, 18 + 4] = 1  # only the centre is legal
    >>> a, logp, v = net.act(obs, torch.Generator().manual_seed(0))
    >>> a.tolist(), logp.abs().max().item() < 1e-6
    ([4, 4], True)
    >>> conv = MaskedActorCritic((6, 7, 2), 7, (128,), torso="conv")
    >>> conv.evaluate(torch.zeros(5, 91), torch.zeros(5))[2].shape
    torch.Size([5])
    >>> from marl.board_game import GameShape
    >>> sym = MaskedActorCritic((6, 7, 2), 7, mirror=GameShape.of("connect_four_v3").mirror)
    >>> x = torch.rand(3, 91); x[:, 84:] = 1
    >>> flip = torch.cat([x[:, :84].reshape(3, 6, 7, 2).flip(2).reshape(3, 84), x[:, 84:]], 1)
    >>> torch.allclose(sym.logits(x), sym.logits(flip).flip(1), atol=1e-6)
    True
    >>> shape = GameShape.of("connect_four_v3")
    >>> fcn = MaskedActorCritic(shape.board, 7, (64,), torso="fcn", cells=shape.cells)
    >>> fcn.evaluate(torch.zeros(5, 91), torch.zeros(5))[2].shape
    torch.Size([5])
    """

    action_shape: tuple[int, ...] = ()
    action_dtype: type = np.int64
    obs_rms = None
    ret_rms = None

    def __init__(self, board: tuple[int, ...], num_actions: int,
                 hidden: tuple[int, ...] = (128, 128), torso: str = "mlp",
                 channels: int = 32, mirror: Sequence[int] | None = None,
                 cells: Sequence[Sequence[int]] | None = None) -> None:
        super().__init__()
        self.board, self.num_actions, self.torso = tuple(board), num_actions, torso
        self.board_features = int(np.prod(board))
        if mirror is not None and sorted(mirror) != list(range(num_actions)):
            raise ValueError(f"mirror {tuple(mirror)} is not a permutation of the "
                             f"{num_actions} moves: pass GameShape.of(game).mirror")
        # not in the state dict: weights load the same with and without it
        self.register_buffer("mirror", None if mirror is None else torch.tensor(mirror),
                             persistent=False)
        if torso == "mlp":
            self.actor = mlp(self.board_features, num_actions, hidden, out_std=0.01)
            self.critic = mlp(self.board_features, 1, hidden, out_std=1.0)
        elif torso == "conv":
            rows, cols, planes = self.board
            width = hidden[-1]
            self.body = nn.Sequential(
                conv(planes, channels, 3, 1, padding=1), nn.ReLU(),
                conv(channels, channels, 3, 1, padding=1), nn.ReLU(),
                conv(channels, 8, 1, 1), nn.ReLU(), nn.Flatten(),
                layer(8 * rows * cols, width), nn.ReLU())
            self.actor = layer(width, num_actions, std=0.01)
            self.critic = layer(width, 1, std=1.0)
        elif torso == "fcn":
            self._fcn(channels, hidden, cells)
        else:
            raise ValueError(f"torso {torso!r} is not known: choose mlp, conv or fcn")

    def _fcn(self, channels: int, hidden: tuple[int, ...],
             cells: Sequence[Sequence[int]] | None) -> None:
        rows, cols, planes = self.board
        covered = {c for where in cells or () for c in where}
        if (not cells or len(cells) != self.num_actions or not all(cells)
                or covered != set(range(rows * cols))):
            raise ValueError("torso fcn needs the board cells of each of the "
                             f"{self.num_actions} moves, covering the {rows}x{cols} board: pass "
                             "cells=GameShape.of(game).cells")
        body: list[nn.Module] = []
        for n_in in (planes + 1, *(channels,) * (FCN_LAYERS - 1)):
            body += [conv(n_in, channels, 3, 1, padding=1), nn.ReLU()]
        self.body = nn.Sequential(*body)
        self.actor = nn.Conv2d(channels, 1, 1)
        nn.init.orthogonal_(self.actor.weight, 0.01)
        nn.init.zeros_(self.actor.bias)
        # the value from its own MLP (the mlp torso's critic): only the policy's loss trains
        # the convolutions
        self.critic = mlp(self.board_features, 1, hidden, out_std=1.0)
        moves = torch.zeros(rows * cols, self.num_actions)
        for move, where in enumerate(cells):
            moves[list(where), move] = 1.0
        # not in the state dict: read from the game (GameShape.cells) each time
        self.register_buffer("moves", moves, persistent=False)

    def _heads(self, obs: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Raw logits, values ``(B,)`` and the action mask of flat observations."""
        x = obs.float().reshape(len(obs), -1)
        board, mask = x[:, : self.board_features], x[:, self.board_features :]
        n = len(x)
        if self.mirror is not None:  # one pass over the positions and their mirror images
            flipped = board.reshape(n, *self.board).flip(2).reshape(n, -1)
            board = torch.cat([board, flipped])
        if self.torso == "fcn":
            planes = board.reshape(len(board), *self.board).permute(0, 3, 1, 2)
            features = self.body(torch.cat([planes, torch.ones_like(planes[:, :1])], 1))
            empty = 1.0 - planes.sum(1).flatten(1)  # a filled cell takes no move
            logits = (self.actor(features).flatten(1) * empty) @ self.moves
            values = self.critic(board).squeeze(-1)
        else:
            if self.torso == "conv":  # planes last in the observation, channels first
                board = self.body(board.reshape(len(board), *self.board).permute(0, 3, 1, 2))
            logits, values = self.actor(board), self.critic(board).squeeze(-1)
        if self.mirror is not None:
            logits = 0.5 * (logits[:n] + logits[n:, self.mirror])
            values = 0.5 * (values[:n] + values[n:])
        return logits, values, mask

    def logits(self, obs: Tensor) -> Tensor:
        """Masked action logits."""
        logits, _, mask = self._heads(obs)
        return masked_logits(logits, mask)

    def value(self, obs: Tensor) -> Tensor:
        """State values, shape ``(B,)``."""
        return self._heads(obs)[1]

    def evaluate(self, obs: Tensor, actions: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Log-probabilities of ``actions``, entropies over legal moves and values."""
        logits, values, mask = self._heads(obs)
        logp_all = torch.log_softmax(masked_logits(logits, mask), dim=-1)
        logp = logp_all.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)
        entropy = -(logp_all.exp() * logp_all.clamp_min(-1e4)).sum(-1)
        return logp, entropy, values

    @torch.inference_mode()
    def act(self, obs: Tensor | np.ndarray, generator: torch.Generator | None = None,
            deterministic: bool = False) -> tuple[Tensor, Tensor, Tensor]:
        """Legal actions (sampled, or the most likely), their log-probabilities and values."""
        logits, values, mask = self._heads(torch.as_tensor(obs, dtype=torch.float32))
        logp_all = torch.log_softmax(masked_logits(logits, mask), dim=-1)
        if deterministic:
            actions = logp_all.argmax(-1)
        else:
            actions = torch.multinomial(logp_all.exp(), 1, generator=generator).squeeze(-1)
        logp = logp_all.gather(-1, actions.unsqueeze(-1)).squeeze(-1)
        return actions, logp, values

    def policy(self, deterministic: bool = True) -> MaskedPolicy:
        """The policy alone (flat observations in, legal actions out)."""
        return MaskedPolicy(self, deterministic)


class MaskedPolicy(nn.Module):
    """A :class:`MaskedActorCritic`'s policy as a module: ``forward(obs) -> actions``."""

    def __init__(self, net: MaskedActorCritic, deterministic: bool = True) -> None:
        super().__init__()
        self.net, self.deterministic = net, deterministic

    def forward(self, obs: Tensor) -> Tensor:
        """Legal actions (int64) for a batch of flat observations."""
        return self.net.act(obs, deterministic=self.deterministic)[0]


def network_player(net: MaskedActorCritic, deterministic: bool = False,
                   seed: int = 0) -> Player:
    """A player that moves by ``net`` (sampling from it unless ``deterministic``)."""
    generator = torch.Generator().manual_seed(seed)

    def play(obs: np.ndarray) -> np.ndarray:
        return net.act(obs, generator, deterministic)[0].numpy()
    return play
