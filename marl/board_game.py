"""Two-player board games from PettingZoo's classic family (``connect_four_v3``,
``tictactoe_v3``) through their AEC API: the masked policy network, the fixed players a
league is measured against, and games between any two players.

A classic game observes a board as planes ``(rows, cols, 2)`` (the mover's pieces, then the
other's) and an ``action_mask``. Networks here take one flat vector per position: the planes,
then the mask (:func:`flat_observation`), so the learner's batches stay plain arrays and the
network masks illegal moves itself.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from daskrl.algos.networks import conv, layer, mlp

GAMES = ("connect_four_v3", "tictactoe_v3")
"""The PettingZoo classic games served: two seats, a board of planes and an action mask."""

Player = Callable[[np.ndarray], np.ndarray]
"""A player: flat observations ``[N, features]`` in, one legal action per row out."""


def make_game(name: str) -> Any:
    """A fresh AEC env of PettingZoo classic game ``name``.

    Raises
    ------
    ValueError
        In one line, for a game that is not served.

    Examples
    --------
    >>> env = make_game("connect_four_v3")
    >>> env.reset(seed=0); env.agent_selection
    'player_0'
    >>> make_game("chess_v6")
    Traceback (most recent call last):
    ...
    ValueError: game 'chess_v6' is not served: choose connect_four_v3 or tictactoe_v3
    """
    if name not in GAMES:
        raise ValueError(f"game {name!r} is not served: choose {' or '.join(GAMES)}")
    return importlib.import_module(f"pettingzoo.classic.{name}").env()


@dataclass(frozen=True)
class GameShape:
    """A game's board and move count, read from its spaces."""

    board: tuple[int, ...]
    """Shape of the observation planes, e.g. ``(6, 7, 2)``."""
    actions: int
    """Moves (the action mask's length)."""
    mirror: tuple[int, ...] | None = None
    """Move ``mirror[a]`` of the board mirrored left to right is move ``a``'s mirror image
    (None: not known)."""
    cells: tuple[tuple[int, ...], ...] = field(default=(), repr=False, compare=False)
    """For each move, the board cells (flat, ``row * cols + col``) it can put a piece on, read
    from the game (:func:`move_cells`): a Connect Four column's six cells, one tic-tac-toe
    cell (empty: not read). The ``fcn`` torso scores each cell and a move by its cells."""

    @property
    def features(self) -> int:
        """Length of a flat observation: the planes, then the mask."""
        return int(np.prod(self.board)) + self.actions

    @classmethod
    def of(cls, name: str) -> GameShape:
        """The shape of game ``name``.

        Examples
        --------
        >>> GameShape.of("connect_four_v3")
        GameShape(board=(6, 7, 2), actions=7, mirror=(6, 5, 4, 3, 2, 1, 0))
        >>> GameShape.of("connect_four_v3").features
        91
        >>> GameShape.of("tictactoe_v3").mirror
        (2, 1, 0, 5, 4, 3, 8, 7, 6)
        >>> GameShape.of("connect_four_v3").cells[0]  # column 0, top row to bottom
        (0, 7, 14, 21, 28, 35)
        """
        return _shape_of(name)


@functools.cache
def _shape_of(name: str) -> GameShape:
    """:meth:`GameShape.of`, read once per process (it plays the game's moves)."""
    env = make_game(name)
    space = env.observation_space(env.possible_agents[0])
    board = tuple(space["observation"].shape)
    actions = int(space["action_mask"].shape[0])
    # where each first move lands, read from the game itself: the mirror of a move is the
    # move that lands on the mirrored cell
    first = []
    for action in range(actions):
        env.reset(seed=0)
        mover = env.agent_selection
        env.step(action)
        first.append(tuple(np.argwhere(env.observe(mover)["observation"][..., 0])[0]))
    mirrored = [(row, board[1] - 1 - col) for row, col in first]
    mirror = tuple(first.index(c) for c in mirrored) if set(mirrored) == set(first) else None
    return GameShape(board, actions, mirror, move_cells(env, actions))


def move_cells(env: Any, actions: int) -> tuple[tuple[int, ...], ...]:
    """The board cells each move can put a piece on (flat indices into the planes'
    ``rows x cols``), read from the game: from a fresh game, the move is played again and
    again (the seats taking turns) while it is legal, each piece's cell noted."""
    out = []
    for action in range(actions):
        env.reset(seed=0)
        cells: set[int] = set()
        while not all(env.terminations.values()) and not all(env.truncations.values()):
            mover = env.agent_selection
            observation = env.observe(mover)
            if not observation["action_mask"][action]:
                break
            before = observation["observation"][..., 0].reshape(-1).copy()
            env.step(action)
            after = env.observe(mover)["observation"][..., 0].reshape(-1)
            cells.update(int(c) for c in np.flatnonzero(after > before))
        out.append(tuple(sorted(cells)))
    return tuple(out)


def flat_observation(observation: dict[str, np.ndarray]) -> np.ndarray:
    """One position as the networks take it: the planes, then the mask, as float32.

    Examples
    --------
    >>> obs = {"observation": np.zeros((3, 3, 2), np.int8), "action_mask": np.ones(9, np.int8)}
    >>> flat_observation(obs).shape
    (27,)
    """
    return np.concatenate([observation["observation"].reshape(-1),
                           observation["action_mask"]]).astype(np.float32)


def masked_logits(logits: Tensor, mask: Tensor) -> Tensor:
    """``logits`` with illegal moves (mask 0) pushed to the dtype's lowest value."""
    return logits.masked_fill(mask < 0.5, torch.finfo(logits.dtype).min)


FCN_LAYERS = 4
"""3x3 convolutions of the ``fcn`` torso: each cell sees the 9x9 around it, every line of
four through it included."""


class MaskedActorCritic(nn.Module):
    """Categorical policy over legal moves and a state value, from flat observations whose
    last ``num_actions`` entries are the action mask.

    ``torso="mlp"``: separate actor and critic MLPs over the flattened planes (as PPO's
    discrete head). ``torso="conv"``: a shared convolutional torso over the board (two 3x3
    convolutions, a 1x1 one down to 8 channels, then a hidden layer), which sees a line of
    pieces wherever it lies on the board. ``torso="fcn"`` (fully convolutional, with
    ``cells``, a :attr:`GameShape.cells`): :data:`FCN_LAYERS` 3x3 convolutions over the planes
    and a plane of ones (so the board's edge differs from an empty cell), then a score for each
    cell; a move's logit is the sum of the scores of its empty cells (a column's, in Connect
    Four); the value is the mlp torso's critic. A line of four through a cell lies inside the
    cell's 9x9 view, and the same filters look at every cell, so a winning or blocking cell
    learned in one place is recognised in others (``benchmarks/board_tactics.py`` compares the
    torsos on Connect Four's tactics). With ``mirror`` (a :attr:`GameShape.mirror`) the
    network is symmetric by construction: logits and value are the means over the position and
    its left-right mirror image, each move's logit taken from its mirror move's, so what it
    learns of a line on one side holds on the other. It offers what
    :class:`daskrl.algos.networks.ActorCritic` promises, so PPO's learner
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


def random_player(shape: GameShape, seed: int = 0) -> Player:
    """A player that picks a legal move uniformly at random.

    Examples
    --------
    >>> play = random_player(GameShape((3, 3, 2), 9))
    >>> obs = np.zeros((1, 27), np.float32); obs[0, 18 + 7] = 1
    >>> play(obs).tolist()
    [7]
    """
    rng = np.random.default_rng(seed)

    def play(obs: np.ndarray) -> np.ndarray:
        mask = obs[:, -shape.actions :] > 0.5
        noise = rng.random(mask.shape)
        return np.where(mask, noise, -1.0).argmax(-1)
    return play


SCRIPTED = {"connect_four_v3": ("lookahead",), "tictactoe_v3": ()}
"""Each game's scripted players a league can keep as fixed members (beside ``random``)."""


def scripted_player(game: str, name: str, seed: int = 0) -> Player:
    """The scripted player ``name`` of ``game``: ``random`` or one of :data:`SCRIPTED`.

    Raises
    ------
    ValueError
        In one line, naming the players the game has.

    Examples
    --------
    >>> scripted_player("tictactoe_v3", "lookahead")
    Traceback (most recent call last):
    ...
    ValueError: tictactoe_v3 has no scripted player 'lookahead': choose from ['random']
    """
    shape = GameShape.of(game)
    if name == "random":
        return random_player(shape, seed)
    if name == "lookahead" and name in SCRIPTED.get(game, ()):
        return lookahead_player(shape, seed)
    raise ValueError(f"{game} has no scripted player {name!r}: choose from "
                     f"{['random', *SCRIPTED.get(game, ())]}")


def landing_rows(mine: np.ndarray, theirs: np.ndarray) -> np.ndarray:
    """Connect Four: the row a piece dropped in each column lands on (-1 for a full column),
    for boards ``[N, 6, 7]`` (row 0 at the top, as PettingZoo observes them)."""
    empty = (mine + theirs) == 0
    rows = np.arange(mine.shape[1])[None, :, None]
    return np.where(empty, rows, -1).max(axis=1)


def completes_four(pieces: np.ndarray, row: int, col: int) -> bool:
    """Whether a piece at ``(row, col)`` makes four in a line with ``pieces`` (one board)."""
    rows, cols = pieces.shape
    for dr, dc in ((0, 1), (1, 0), (1, 1), (1, -1)):
        count = 1
        for sign in (1, -1):
            r, c = row + sign * dr, col + sign * dc
            while 0 <= r < rows and 0 <= c < cols and pieces[r, c]:
                count += 1
                r, c = r + sign * dr, c + sign * dc
        if count >= 4:
            return True
    return False


def winning_moves(mine: np.ndarray, theirs: np.ndarray) -> list[int]:
    """Connect Four: the columns where the owner of ``mine`` wins at once (one board).

    Examples
    --------
    >>> mine, theirs = np.zeros((6, 7)), np.zeros((6, 7))
    >>> mine[5, 0:3] = 1; theirs[4, 0:3] = 1
    >>> winning_moves(mine, theirs), winning_moves(theirs, mine)
    ([3], [])
    """
    land = landing_rows(mine[None], theirs[None])[0]
    return [c for c in range(mine.shape[1]) if land[c] >= 0 and completes_four(mine, land[c], c)]


def called_for(mine: np.ndarray, theirs: np.ndarray) -> tuple[str, list[int]]:
    """Connect Four: what a position calls for (one board): ``("win", columns that win at
    once)``, else ``("block", columns where the other side wins at once)``, else ``("", [])``.

    Examples
    --------
    >>> mine, theirs = np.zeros((6, 7)), np.zeros((6, 7))
    >>> theirs[5, 0:3] = 1; mine[4, 0:2] = 1
    >>> called_for(mine, theirs), called_for(theirs, mine)
    (('block', [3]), ('win', [3]))
    >>> mine[3:6, 6] = 1  # three of its own up column 6: its win comes before the block
    >>> called_for(mine, theirs)
    ('win', [6])
    """
    win = winning_moves(mine, theirs)
    if win:
        return "win", win
    threats = winning_moves(theirs, mine)
    return ("block", threats) if threats else ("", [])


def tactical_positions(count: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Connect Four positions from random games that call for a move (:func:`called_for`):
    a win now, or the block of the other side's only immediate win (two threats cannot both
    be blocked). Returns ``count`` flat observations ``[count, 91]`` and, for each, which of
    the 7 moves do what the position calls for (``[count, 7]`` bool: every winning column).

    Examples
    --------
    >>> obs, right = tactical_positions(3)
    >>> obs.shape, right.shape, bool(right.any(1).all())
    ((3, 91), (3, 7), True)
    """
    rng = np.random.default_rng(seed)
    found: list[np.ndarray] = []
    right: list[np.ndarray] = []
    env = make_game("connect_four_v3")
    while len(found) < count:
        env.reset(seed=int(rng.integers(2**31)))
        while len(found) < count and not all(env.terminations.values()):
            obs = flat_observation(env.observe(env.agent_selection))
            planes = obs[:84].reshape(6, 7, 2)
            kind, columns = called_for(planes[:, :, 0], planes[:, :, 1])
            if kind == "win" or (kind == "block" and len(columns) == 1):
                found.append(obs)
                right.append(np.isin(np.arange(7), columns))
            env.step(int(rng.choice(np.flatnonzero(obs[84:]))))
    return np.stack(found), np.stack(right)


def lookahead_player(shape: GameShape, seed: int = 0) -> Player:
    """Connect Four's one-step look-ahead player: it wins when it can, blocks a win of the
    other player when it must, and otherwise moves at random among the legal moves.

    Examples
    --------
    >>> shape = GameShape((6, 7, 2), 7)
    >>> planes = np.zeros((6, 7, 2), np.float32); planes[5, 0:3, 1] = 1  # three of theirs
    >>> obs = np.concatenate([planes.reshape(-1), np.ones(7, np.float32)])[None]
    >>> lookahead_player(shape)(obs).tolist()  # blocks at column 3
    [3]
    """
    if shape.board != (6, 7, 2):
        raise ValueError(f"the look-ahead player plays connect_four_v3, not a board of shape "
                         f"{shape.board}")
    fallback = random_player(shape, seed)

    def play(obs: np.ndarray) -> np.ndarray:
        actions = fallback(obs)
        planes = obs[:, : -shape.actions].reshape(len(obs), *shape.board)
        for i in range(len(obs)):
            columns = called_for(planes[i, :, :, 0], planes[i, :, :, 1])[1]
            if columns:
                actions[i] = columns[0]
        return actions
    return play


@dataclass
class Score:
    """Games won, drawn and lost by one player against another."""

    wins: int = 0
    draws: int = 0
    losses: int = 0

    @property
    def games(self) -> int:
        """Games played."""
        return self.wins + self.draws + self.losses

    @property
    def win_rate(self) -> float:
        """Share of games won."""
        return self.wins / max(1, self.games)

    def interval(self, z: float = 1.96) -> tuple[float, float]:
        """Wilson's 95 % interval of the win rate.

        Examples
        --------
        >>> lo, hi = Score(wins=95, losses=5).interval()
        >>> round(lo, 3), round(hi, 3)
        (0.888, 0.978)
        """
        n = max(1, self.games)
        p = self.wins / n
        centre = (p + z * z / (2 * n)) / (1 + z * z / n)
        half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
        return float(centre - half), float(centre + half)


def play_games(game: str, first: Player, second: Player, games: int, seed: int = 0,
               batch: int = 64) -> Score:
    """``games`` games of ``first`` (the first seat, moving first) against ``second``,
    ``batch`` at a time with one call of each player per move; ``first``'s score.

    Examples
    --------
    >>> shape = GameShape.of("connect_four_v3")
    >>> score = play_games("connect_four_v3", lookahead_player(shape, 1),
    ...                    random_player(shape, 2), 40)
    >>> score.games, score.win_rate > 0.7
    (40, True)
    """
    score = Score()
    done_games = 0
    while done_games < games:
        n = min(batch, games - done_games)
        envs = [make_game(game) for _ in range(n)]
        for i, env in enumerate(envs):
            env.reset(seed=seed + done_games + i)
        live = list(range(n))
        while live:
            movers: dict[str, list[int]] = {}
            for i in live:
                movers.setdefault(envs[i].agent_selection, []).append(i)
            for agent, idx in movers.items():
                obs = np.stack([flat_observation(envs[i].observe(agent)) for i in idx])
                actions = (first if agent == envs[idx[0]].possible_agents[0] else second)(obs)
                for i, a in zip(idx, actions, strict=True):
                    envs[i].step(int(a))
            still = []
            for i in live:
                env = envs[i]
                if all(env.terminations.values()) or all(env.truncations.values()):
                    reward = env.rewards[env.possible_agents[0]]
                    score.wins += reward > 0
                    score.losses += reward < 0
                    score.draws += reward == 0
                else:
                    still.append(i)
            live = still
        done_games += n
    return score


def both_seats(game: str, player: Player, other: Player, games: int, seed: int = 0
               ) -> dict[str, Score]:
    """``player``'s score from each seat, ``games`` games in each.

    Examples
    --------
    >>> shape = GameShape.of("tictactoe_v3")
    >>> seats = both_seats("tictactoe_v3", random_player(shape, 1), random_player(shape, 2), 20)
    >>> sorted(seats), seats["first"].games
    (['first', 'second'], 20)
    """
    first = play_games(game, player, other, games, seed)
    flipped = play_games(game, other, player, games, seed + games)
    second = Score(flipped.losses, flipped.draws, flipped.wins)
    return {"first": first, "second": second}
