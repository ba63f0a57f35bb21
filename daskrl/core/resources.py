"""Resource annotations for fragments, translated into Dask's worker-resource dicts."""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*$")


@dataclass(frozen=True)
class Resources:
    """What one replica of a fragment needs from the worker it runs on.

    Parameters
    ----------
    cpu : float
        CPU slots (Dask resource ``CPU``).
    gpu : float
        GPUs (Dask resource ``GPU``).
    custom : Mapping[str, float]
        Any other Dask worker resource, e.g. ``{"MEM_GB": 4}``.
    fallback : Resources or None
        Used instead when no worker offers these resources (e.g. a learner
        that prefers a GPU but may run on a CPU).

    Notes
    -----
    Zero entries are left out of the Dask dict: Dask restricts a task that names a
    resource, even with value 0, to workers that advertise it.

    Examples
    --------
    >>> Resources(gpu=1).to_dask()
    {'GPU': 1}
    >>> Resources(cpu=1, custom={"fast_disk": 1}).to_dask()
    {'CPU': 1, 'fast_disk': 1}
    """

    cpu: float = 0
    gpu: float = 0
    custom: Mapping[str, float] = field(default_factory=dict)
    fallback: Resources | None = None

    def __post_init__(self) -> None:
        for name, value in (("cpu", self.cpu), ("gpu", self.gpu), *self.custom.items()):
            if not isinstance(name, str) or not _KEY.match(name):
                raise ValueError(
                    f"resource name {name!r} is not valid: use letters, digits, '_' or '.', "
                    "starting with a letter"
                )
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise TypeError(f"resource {name!r} must be a number, got {value!r}")
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"resource {name!r} must be a finite number >= 0, got {value!r}")
        clash = {k for k in self.custom if k.upper() in ("CPU", "GPU")}
        if clash:
            raise ValueError(f"use cpu=/gpu= instead of custom keys {sorted(clash)}")
        if self.fallback is not None and not isinstance(self.fallback, Resources):
            raise TypeError(
                f"fallback must be a Resources (e.g. fallback=Resources(cpu=1)), "
                f"got {self.fallback!r}")
        object.__setattr__(self, "cpu", _plain(self.cpu))
        object.__setattr__(self, "gpu", _plain(self.gpu))
        object.__setattr__(self, "custom", {k: _plain(v) for k, v in self.custom.items()})

    def to_dask(self) -> dict[str, float]:
        """The ``resources=`` dict for ``dask.annotate``, zero entries omitted."""
        out: dict[str, float] = {}
        if self.cpu:
            out["CPU"] = self.cpu
        if self.gpu:
            out["GPU"] = self.gpu
        out.update({k: v for k, v in self.custom.items() if v})
        return out

    @property
    def threads(self) -> int:
        """The torch and BLAS threads a task with these resources runs with: its CPU grant
        (whole CPUs, at least one).

        Examples
        --------
        >>> Resources(cpu=4).threads, Resources(gpu=1).threads, Resources(cpu=0.5).threads
        (4, 1, 1)
        """
        return max(1, int(self.cpu))

    def satisfied_by(self, offered: Mapping[str, float]) -> bool:
        """Whether a worker advertising ``offered`` can run this fragment."""
        return all(offered.get(k, 0) >= v for k, v in self.to_dask().items())

    def resolve(self, workers: Mapping[str, Mapping[str, float]]) -> Resources:
        """These resources, or the first fallback that some worker satisfies.

        Raises
        ------
        ValueError
            When neither these resources nor any fallback is offered by a worker.
        """
        chain: list[Resources] = []
        current: Resources | None = self
        while current is not None:
            chain.append(current)
            if any(current.satisfied_by(r) for r in workers.values()):
                return current
            current = current.fallback
        wanted = " or ".join(str(r.to_dask()) for r in chain)
        raise ValueError(f"no worker offers {wanted}")

    def __str__(self) -> str:
        text = ",".join(f"{k}:{v:g}" for k, v in self.to_dask().items()) or "none"
        return text + (f" (else {self.fallback})" if self.fallback else "")


def _plain(value: float) -> float:
    """A Python int for whole numbers (numpy scalars included), else a float."""
    value = float(value)
    return int(value) if value.is_integer() else value


def parse_resources(text: str) -> Resources:
    """Parse ``KEY:N[,KEY:N]`` (e.g. ``GPU:1,CPU:2``) into :class:`Resources`.

    Examples
    --------
    >>> parse_resources("GPU:1,CPU:2")
    Resources(cpu=2, gpu=1, custom={}, fallback=None)
    """
    values: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, num = part.partition(":")
        if not sep:
            key, sep, num = part.partition("=")
        key = key.strip()
        if key.upper() in ("CPU", "GPU"):
            key = key.upper()
        if key in values:
            raise ValueError(f"resource {key!r} appears twice in {text!r}")
        try:
            values[key] = float(num)
        except ValueError:
            raise ValueError(
                f"malformed resource {part!r} in {text!r}: write KEY:N, e.g. GPU:1,CPU:2"
            ) from None
    if not values:
        raise ValueError(f"empty resource spec {text!r}: write KEY:N, e.g. GPU:1")
    cpu = values.pop("CPU", 0.0)
    gpu = values.pop("GPU", 0.0)
    return Resources(cpu=cpu, gpu=gpu, custom=values)


def parse_role_resources(items: list[str]) -> dict[str, Resources]:
    """Parse repeated ``ROLE=KEY:N[,KEY:N]`` flags into ``{role: Resources}``.

    Examples
    --------
    >>> parse_role_resources(["learner=GPU:1"])["learner"].to_dask()
    {'GPU': 1}
    """
    out: dict[str, Resources] = {}
    for item in items:
        role, sep, spec = item.partition("=")
        if not sep or not role.strip():
            raise ValueError(
                f"malformed --resources {item!r}: write ROLE=KEY:N[,KEY:N], e.g. learner=GPU:1"
            )
        try:
            out[role.strip()] = parse_resources(spec)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"--resources {item!r}: {exc}") from None
    return out
