"""What an algorithm holds per env step and in its model: the sizes the memory check uses.

A graph script states them on its :class:`~daskrl.core.algorithm.Algorithm` (``sizes=``); the
driver's memory check (:mod:`daskrl.runtime.memory`) turns them into a per-worker estimate.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

MiB = 2**20
FLOAT_BYTES = 4


@dataclass(frozen=True)
class Sizes:
    """What an algorithm holds per env step and in its model, for the memory check.

    Parameters
    ----------
    transition_bytes : int
        Bytes one env step adds to a rollout batch: observations, actions, rewards, values,
        log-probabilities, advantages and returns of every agent of that env
        (:func:`transition_bytes` computes it for float32 observations).
    model_params : int
        Parameters of the learner's model (policy and critic).
    replay_bytes : int
        Bytes of an off-policy algorithm's replay at full capacity, all shards together
        (0: no replay).

    Examples
    --------
    >>> Sizes(transition_bytes=transition_bytes(obs_dim=4), model_params=9_000)
    Sizes(transition_bytes=47, model_params=9000, replay_bytes=0)
    """

    transition_bytes: int = 0
    model_params: int = 0
    replay_bytes: int = 0

    def __post_init__(self) -> None:
        for name in ("transition_bytes", "model_params", "replay_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"Sizes.{name} must be an int >= 0, got {value!r}")


def transition_bytes(obs_dim: int, agents: int = 1, obs_itemsize: int = FLOAT_BYTES,
                     action_bytes: int = 8) -> int:
    """Bytes of one env step in a rollout batch with observations of ``obs_dim`` values.

    Per agent: the observation (float32, or ``obs_itemsize`` bytes a value: 1 for uint8
    frames), the action (an int64 index, or ``action_bytes``), float32 reward, value,
    log-probability, advantage and return, and three bool flags (terminated, done, valid).

    Examples
    --------
    >>> transition_bytes(4), transition_bytes(16, agents=4)
    (47, 380)
    >>> transition_bytes(4 * 84 * 84, obs_itemsize=1)  # 4 stacked Atari frames
    28255
    """
    return agents * (obs_itemsize * obs_dim + action_bytes + 5 * FLOAT_BYTES + 3)


def mlp_params(inputs: int, outputs: int, hidden: Sequence[int]) -> int:
    """Parameters (weights and biases) of a fully connected network.

    Examples
    --------
    >>> mlp_params(4, 2, (64, 64))  # 4*64+64 + 64*64+64 + 64*2+2
    4610
    """
    total, n_in = 0, inputs
    for width in (*hidden, outputs):
        total += n_in * width + width
        n_in = width
    return total


def format_bytes(n: float) -> str:
    """``n`` bytes in KiB/MiB/GiB.

    Examples
    --------
    >>> format_bytes(3 * 2**30), format_bytes(1536)
    ('3.0 GiB', '1.5 KiB')
    """
    for unit, scale in (("GiB", 2**30), ("MiB", MiB), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} B"
