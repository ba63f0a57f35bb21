"""What a sweep trains: its trials (a configuration and a seed each), their folders, and
the search space of ``--search`` and ``--pbt``."""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Trial:
    """One run of the sweep: the graph's settings that differ from the sweep's, and a seed.

    Examples
    --------
    >>> t = Trial("t001-learning_rate=0.001-seed2", {"learning_rate": 0.001}, 2)
    >>> t.group
    'learning_rate=0.001'
    """

    name: str
    """Its folder under the sweep's ``OUT``."""
    config: dict[str, Any] = field(default_factory=dict)
    """``Config`` fields set for this trial (beyond the sweep's own settings)."""
    seed: int = 1

    @property
    def group(self) -> str:
        """The configuration without the seed: trials of one group are its seeds."""
        return label(self.config)


def label(config: Mapping[str, Any]) -> str:
    """``key=value,...`` of ``config`` in its order; ``default`` when empty.

    Examples
    --------
    >>> label({"learning_rate": 0.00025, "hidden": 64})
    'learning_rate=0.00025,hidden=64'
    >>> label({})
    'default'
    """
    return ",".join(f"{k}={_short(v)}" for k, v in config.items()) or "default"


def _short(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (list, tuple)):
        return "x".join(_short(v) for v in value)
    return str(value)


def folder_name(index: int, config: Mapping[str, Any], seed: int) -> str:
    """A trial's folder: its number, configuration and seed, in characters any file system
    takes.

    Examples
    --------
    >>> folder_name(3, {"env": "ALE/Pong-v5", "learning_rate": 1e-3}, 2)
    't003-env=ALE_Pong-v5,learning_rate=0.001-seed2'
    """
    text = f"t{index:03d}" + (f"-{label(config)}" if config else "") + f"-seed{seed}"
    return re.sub(r"[^A-Za-z0-9._=,+-]", "_", text)[:120]


def grid_trials(grid: Mapping[str, Sequence[Any]], seeds: Sequence[int]) -> list[Trial]:
    """Every combination of ``grid``'s values (in its order), each with every seed.

    Examples
    --------
    >>> [t.name for t in grid_trials({"learning_rate": [1e-3, 3e-4]}, [1, 2])]
    ... # doctest: +NORMALIZE_WHITESPACE
    ['t000-learning_rate=0.001-seed1', 't001-learning_rate=0.001-seed2',
     't002-learning_rate=0.0003-seed1', 't003-learning_rate=0.0003-seed2']
    >>> grid_trials({}, [1])[0]
    Trial(name='t000-seed1', config={}, seed=1)
    """
    keys = list(grid)
    trials = []
    for values in itertools.product(*(grid[k] for k in keys)):
        config = dict(zip(keys, values, strict=True))
        for seed in seeds:
            trials.append(Trial(folder_name(len(trials), config, seed), config, seed))
    return trials


@dataclass(frozen=True)
class Dimension:
    """One searched setting: a range (``low``-``high``, on a log scale or not) or choices.

    Examples
    --------
    >>> Dimension("learning_rate", low=1e-4, high=1e-2, log=True).clip(0.5)
    0.01
    """

    name: str
    low: float | None = None
    high: float | None = None
    log: bool = False
    choices: tuple[Any, ...] = ()
    integer: bool = False

    def clip(self, value: float) -> float:
        """``value`` held inside the range (PBT's perturbations stay in it)."""
        if self.low is None or self.high is None:
            return value
        held = min(self.high, max(self.low, value))
        return int(round(held)) if self.integer else held

    def sample(self, rng: Any) -> Any:
        """A value drawn uniformly (log-uniformly on a log scale) with numpy's ``rng``."""
        if self.choices:
            return self.choices[int(rng.integers(len(self.choices)))]
        assert self.low is not None and self.high is not None
        if self.log:
            value = math.exp(rng.uniform(math.log(self.low), math.log(self.high)))
        else:
            value = rng.uniform(self.low, self.high)
        return self.clip(value)


def parse_dimension(text: str, kinds: Mapping[str, type]) -> Dimension:
    """``KEY=LOW:HIGH[:log]`` (a range) or ``KEY=V1,V2,...`` (choices) for a ``Config``
    field; ``kinds`` maps each field to its type (int, float, or another: choices only).

    Raises
    ------
    ValueError
        One line naming the bad word and the spelling expected.

    Examples
    --------
    >>> parse_dimension("learning_rate=1e-4:1e-2:log", {"learning_rate": float})
    Dimension(name='learning_rate', low=0.0001, high=0.01, log=True, choices=(), integer=False)
    >>> parse_dimension("hidden=32,64", {"hidden": int}).choices
    (32, 64)
    >>> parse_dimension("lr=1:2", {"learning_rate": float})
    Traceback (most recent call last):
    ...
    ValueError: --space lr=1:2: the graph's Config has no field 'lr'; it has ['learning_rate']
    """
    key, sep, value = text.partition("=")
    key = key.strip().replace("-", "_")
    if not sep or not value:
        raise ValueError(f"--space {text}: expected KEY=LOW:HIGH[:log] or KEY=V1,V2,...")
    if key not in kinds:
        raise ValueError(f"--space {text}: the graph's Config has no field {key!r}; it has "
                         f"{sorted(kinds)}")
    kind = kinds[key]
    if ":" not in value:
        return Dimension(key, choices=tuple(_typed(text, v, kind) for v in value.split(",")))
    parts = value.split(":")
    if kind not in (int, float) or len(parts) not in (2, 3) or (
            len(parts) == 3 and parts[2] != "log"):
        raise ValueError(f"--space {text}: a range is KEY=LOW:HIGH or KEY=LOW:HIGH:log, for "
                         "a number field")
    low, high = (_typed(text, p, kind) for p in parts[:2])
    log = len(parts) == 3
    if not low < high or (log and low <= 0):
        raise ValueError(f"--space {text}: needs LOW < HIGH" + (" and LOW > 0 on a log "
                                                                "scale" if log else ""))
    return Dimension(key, float(low), float(high), log, integer=kind is int)


def _typed(text: str, word: str, kind: type) -> Any:
    word = word.strip()
    if kind is bool:
        if word.lower() not in ("true", "false"):
            raise ValueError(f"--space {text}: {word!r} is not true or false")
        return word.lower() == "true"
    if kind in (int, float, str):
        try:
            return kind(word)
        except ValueError:
            raise ValueError(f"--space {text}: {word!r} is not a {kind.__name__}") from None
    return word
