"""Checks of one agent's action against its gymnasium space, for the PettingZoo views.

A wrong action is an error naming the agent and its space (as mpe2 refuses them), never a
silent no-op, a rounded integer or NaN observations.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from gymnasium import spaces
from torch import Tensor

__all__ = ["box_action", "check_agent_names", "discrete_action"]


def check_agent_names(actions: dict[str, Any], live: Sequence[str]) -> None:
    """Refuse an action dict whose agents are not exactly the live ones.

    Examples
    --------
    >>> check_agent_names({"good_0": 1}, ["agent_0"])
    Traceback (most recent call last):
    ...
    ValueError: actions for unknown agent(s) ['good_0'] and none for ['agent_0']: ...
    """
    if not isinstance(actions, dict):
        raise ValueError(f"actions must be a dict {{agent name: action}}, got "
                         f"{type(actions).__name__}")
    unknown = [n for n in actions if n not in live]
    missing = [n for n in live if n not in actions]
    if unknown or missing:
        what = [f"unknown agent(s) {unknown}" if unknown else "",
                f"none for {missing}" if missing else ""]
        raise ValueError(f"actions for {' and '.join(w for w in what if w)}: "
                         f"give one action for each live agent {list(live)}".replace(
                             "actions for none", "no actions"))


def discrete_action(name: str, action: Any, space: spaces.Discrete) -> int:
    """``action`` as an int, if it is an integer inside ``space``; else a ValueError naming
    ``name`` and the space.

    Examples
    --------
    >>> discrete_action("agent_0", np.int64(3), spaces.Discrete(5))
    3
    >>> discrete_action("agent_0", 2.7, spaces.Discrete(5))
    Traceback (most recent call last):
    ...
    ValueError: agent 'agent_0': action 2.7 (float) is not an integer of Discrete(5) (0..4)
    """
    value = action
    if isinstance(value, (np.ndarray, Tensor)) and value.ndim == 0:
        value = value.item() if not isinstance(value, np.ndarray) else value[()]
    integral = isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))
    hi = int(space.start) + int(space.n) - 1
    if not integral:
        raise ValueError(f"agent {name!r}: action {action!r} ({type(action).__name__}) is not "
                         f"an integer of {space} ({int(space.start)}..{hi})")
    if not space.contains(int(value)):
        raise ValueError(f"agent {name!r}: action {int(value)} is outside {space} "
                         f"({int(space.start)}..{hi})")
    return int(value)


def box_action(name: str, action: Any, space: spaces.Box) -> np.ndarray:
    """``action`` as a float array of ``space``'s shape and dtype, if it has that shape and
    finite values (out-of-range values are clipped by the env, as mpe2 does); else a
    ValueError naming ``name`` and the space.

    Examples
    --------
    >>> box_action("agent_0", [0.0, 1.0, 0.0, 0.0, 0.0], spaces.Box(0, 1, (5,))).shape
    (5,)
    >>> box_action("agent_0", [0.1, 0.2], spaces.Box(0, 1, (5,)))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: agent 'agent_0': action of shape (2,), expected Box(0.0, 1.0, (5,), float32)...
    """
    if isinstance(action, Tensor):
        action = action.detach().cpu().numpy()
    try:
        arr = np.asarray(action, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"agent {name!r}: action {action!r} is not numeric; expected "
                         f"{space}") from None
    if arr.shape != space.shape:
        raise ValueError(f"agent {name!r}: action of shape {arr.shape}, expected {space} "
                         f"(shape {space.shape})")
    if not np.isfinite(arr).all():
        raise ValueError(f"agent {name!r}: action {arr.tolist()} is not finite; expected "
                         f"{space}")
    return arr.astype(space.dtype)
