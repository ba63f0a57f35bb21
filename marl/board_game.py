"""Two-player board games from PettingZoo's classic family (``connect_four_v3``,
``tictactoe_v3``) through their AEC API: each game's shape, the fixed players a league is
measured against, Connect Four's tactics, and games between any two players (the networks
are in :mod:`marl.board_network`).

A classic game observes a board as planes ``(rows, cols, 2)`` (the mover's pieces, then the
other's) and an ``action_mask``. Networks here take one flat vector per position: the planes,
then the mask (:func:`flat_observation`), so the learner's batches stay plain arrays and the
network masks illegal moves itself.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

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
