"""The board-game networks' fully convolutional torso (``--torso fcn``): each move scored by
the board cells it can take, read from the game, and what that buys on Connect Four's
tactics."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from script_loader import BENCH, script

from marl.board_game import GameShape, make_game, tactical_positions
from marl.board_network import MaskedActorCritic


@pytest.fixture(scope="module")
def tactics():
    """``benchmarks/board_tactics.py`` as a module (its training loop is the one measured)."""
    threads = torch.get_num_threads()
    try:
        with script(BENCH / "board_tactics.py", "board_tactics") as module:
            torch.set_num_threads(1)
            yield module
    finally:
        torch.set_num_threads(threads)


def fours(pieces: np.ndarray) -> bool:
    """Whether ``pieces`` (6 x 7) hold four in a line anywhere: every window of every
    direction, independently of :func:`marl.board_game.completes_four`."""
    for dr, dc in ((0, 1), (1, 0), (1, 1), (1, -1)):
        for r in range(6):
            for c in range(7):
                cells = [(r + k * dr, c + k * dc) for k in range(4)]
                if all(0 <= y < 6 and 0 <= x < 7 and pieces[y, x] for y, x in cells):
                    return True
    return False


def drop(pieces: np.ndarray, other: np.ndarray, column: int) -> np.ndarray:
    """``pieces`` with one more dropped in ``column`` (the lowest empty row)."""
    row = max(r for r in range(6) if not pieces[r, column] and not other[r, column])
    out = pieces.copy()
    out[row, column] = 1
    return out


def test_each_moves_cells_are_read_from_the_game():
    """A Connect Four move can fill any cell of its column and a tic-tac-toe move one cell,
    and the cells read agree with where the game puts each move's piece."""
    c4 = GameShape.of("connect_four_v3")
    assert c4.cells == tuple(tuple(row * 7 + col for row in range(6)) for col in range(7))
    ttt = GameShape.of("tictactoe_v3")
    env = make_game("tictactoe_v3")
    for move, cells in enumerate(ttt.cells):
        env.reset(seed=0)
        mover = env.agent_selection
        env.step(move)
        assert cells == tuple(np.flatnonzero(env.observe(mover)["observation"][..., 0]))


def test_a_moves_logit_is_the_sum_of_its_empty_cells_scores():
    """The fcn torso's cell head scores every cell; a move's logit (before the mask) is the
    sum over the empty cells it can take (a column's empty cells in Connect Four)."""
    shape = GameShape.of("connect_four_v3")
    torch.manual_seed(0)
    net = MaskedActorCritic(shape.board, shape.actions, (32,), "fcn", cells=shape.cells)
    obs = torch.as_tensor(tactical_positions(16, seed=3)[0])
    planes = obs[:, :84].reshape(16, 6, 7, 2).permute(0, 3, 1, 2)
    scores = net.actor(net.body(torch.cat([planes, torch.ones_like(planes[:, :1])], 1)))
    empty = planes.sum(1) == 0
    by_column = (scores.squeeze(1) * empty).sum(1)  # [16, 7]: empty rows summed by column
    logits = net.logits(obs)
    legal = obs[:, 84:] > 0.5
    torch.testing.assert_close(logits[legal], by_column[legal])
    assert (logits[~legal] == torch.finfo(logits.dtype).min).all()
    with pytest.raises(ValueError, match="cells=GameShape.of"):
        MaskedActorCritic(shape.board, shape.actions, (32,), "fcn")
    with pytest.raises(ValueError, match="covering the 6x7 board"):
        MaskedActorCritic(shape.board, shape.actions, (32,), "fcn", cells=((0,),) * 7)


def test_tactical_positions_call_for_a_win_or_the_only_block():
    """Checked by brute force over every line of the board: the position is not over, a right
    move wins at once, and in a block position the other side has exactly one winning
    column, which the right move takes; both kinds occur."""
    obs, right = tactical_positions(60, seed=1)
    kinds = set()
    for x, ok in zip(obs, right, strict=True):
        planes = x[:84].reshape(6, 7, 2)
        mine, theirs = planes[:, :, 0], planes[:, :, 1]
        assert not fours(mine) and not fours(theirs)
        assert mine.sum() - theirs.sum() in (0, -1)  # the mover has as many pieces, or one fewer
        legal = np.flatnonzero(x[84:])
        wins = [c for c in legal if fours(drop(mine, theirs, c))]
        threats = [c for c in legal if fours(drop(theirs, mine, c))]
        if wins:
            kinds.add("win")
            assert list(np.flatnonzero(ok)) == wins
        else:
            kinds.add("block")
            assert len(threats) == 1 and list(np.flatnonzero(ok)) == threats
    assert kinds == {"win", "block"}


def test_the_fcn_torso_learns_connect_four_tactics_faster_than_the_mlp(tactics):
    """Trained on the same 3,000 positions for the same 12 epochs, the fully convolutional
    torso makes the right move in clearly more unseen positions than the MLP
    (``benchmarks/board_tactics.py`` measures it at 50k positions: see league.md)."""
    obs, right = tactical_positions(4000, seed=0)
    train, test = tactics.unseen(torch.as_tensor(obs), torch.as_tensor(right), 3000)
    fcn = tactics.train_and_test("fcn", train, test, epochs=12, seed=0)["accuracy"]
    mlp = tactics.train_and_test("mlp", train, test, epochs=12, seed=0)["accuracy"]
    assert fcn >= 0.6 and fcn >= mlp + 0.1, (fcn, mlp)
