"""MAPPO's environments: which batched multi-agent env to build, its team layout, and the
device an actor or learner built inside a Dask task should use."""

from __future__ import annotations

import functools
import importlib
import inspect
from dataclasses import dataclass
from typing import Any

import torch

from .team_layout import TeamLayout

MPE_TASKS = {
    "simple": "mpe2.simple_v3", "simple_adversary": "mpe2.simple_adversary_v3",
    "simple_crypto": "mpe2.simple_crypto_v3", "simple_push": "mpe2.simple_push_v3",
    "simple_reference": "mpe2.simple_reference_v3",
    "simple_speaker_listener": "mpe2.simple_speaker_listener_v4",
    "simple_spread": "mpe2.simple_spread_v3", "simple_tag": "mpe2.simple_tag_v3",
    "simple_world_comm": "mpe2.simple_world_comm_v3",
}
"""mpe2's parallel envs by short name (``simple_tag`` itself names the batched
:class:`~marl.simple_tag.SimpleTag`; ``mpe2.simple_tag_v3`` runs mpe2's through the adapter)."""

ALIASES = {k: v for k, v in MPE_TASKS.items() if k != "simple_tag"}
"""Short env names that resolve to PettingZoo modules (``simple_tag`` is our batched one)."""

@dataclass(frozen=True)
class EnvSpec:
    """Which batched multi-agent env to build, and its settings.

    Parameters
    ----------
    name : str
        ``"simple_tag"`` (:class:`marl.simple_tag.SimpleTag`), another mpe2 task by its
        short name (``"simple_spread"``, ``"simple_world_comm"``...: :data:`MPE_TASKS`) or the
        dotted module of any PettingZoo parallel env with a ``parallel_env()`` function
        (e.g. ``"mpe2.simple_adversary_v3"``).
    max_cycles : int
        Steps per episode.
    num_good, num_adversaries, num_obstacles, num_agent_neighbors : int
        Simple tag's teams, obstacles, and ``k`` nearest agents observed (0: all).
    num_agents : int
        ``N`` of ``simple_spread``.

    Examples
    --------
    >>> env = EnvSpec("simple_tag", num_adversaries=2).make(4, seed=0)
    >>> env.reset(seed=0).shape
    torch.Size([4, 3, 14])
    >>> EnvSpec("simple_tagg")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: env 'simple_tagg': use simple_tag, an mpe2 task (simple, ...
    """

    name: str = "simple_tag"
    max_cycles: int = 25
    num_good: int = 1
    num_adversaries: int = 3
    num_obstacles: int = 2
    num_agent_neighbors: int = 0
    num_agents: int = 3

    def __post_init__(self) -> None:
        if self.name != "simple_tag" and self.name not in ALIASES and "." not in self.name:
            raise ValueError(f"env {self.name!r}: use simple_tag, an mpe2 task "
                             f"({', '.join(ALIASES)}) or the dotted module of a PettingZoo "
                             "parallel env (e.g. mpe2.simple_adversary_v3)")
        for field_name in ("max_cycles", "num_good", "num_adversaries", "num_agents"):
            if getattr(self, field_name) < 1:
                raise ValueError(f"{field_name} must be >= 1, got {getattr(self, field_name)}")

    def make(self, num_envs: int, seed: int, device: str = "cpu") -> Any:
        """``num_envs`` environments on ``device``, reset with ``seed``."""
        if self.name == "simple_tag":
            from .simple_tag import SimpleTag

            env: Any = SimpleTag(
                num_envs, device=device, num_good=self.num_good,
                num_adversaries=self.num_adversaries, num_obstacles=self.num_obstacles,
                num_agent_neighbors=self.num_agent_neighbors or None,
                max_cycles=self.max_cycles)
        else:
            from .pettingzoo import PettingZooBatchEnv

            env = PettingZooBatchEnv(functools.partial(self._parallel_env), num_envs,
                                     device=device)
        env.reset(seed=seed)
        return env

    def _parallel_env(self) -> Any:
        module_name = ALIASES.get(self.name, self.name)
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise ValueError(f"env {self.name!r}: cannot import {module_name!r} ({exc}); "
                             "install the package that provides it") from None
        factory = getattr(module, "parallel_env", None)
        if factory is None:
            raise ValueError(f"env {self.name!r}: module {module_name!r} has no parallel_env(); "
                             "pass a PettingZoo env module")
        target = getattr(module, "raw_env", factory)  # parallel_env often takes **kwargs
        params = inspect.signature(target).parameters
        open_kwargs = any(p.kind is p.VAR_KEYWORD for p in params.values())
        kwargs: dict[str, Any] = {}
        if "max_cycles" in params or open_kwargs:
            kwargs["max_cycles"] = self.max_cycles
        if module_name.endswith("simple_spread_v3"):
            kwargs["N"] = self.num_agents
        try:
            return factory(**kwargs)
        except TypeError as exc:
            raise ValueError(f"env {self.name!r}: {module_name}.parallel_env({kwargs}) failed "
                             f"({exc}); use an env that takes max_cycles") from None


@functools.lru_cache(maxsize=16)
def layout_of(env: EnvSpec) -> TeamLayout:
    """The team layout of ``env`` (probed once per process on a one-env copy).

    Examples
    --------
    >>> layout_of(EnvSpec("simple_spread")).names
    ('agent',)
    """
    probe = env.make(1, seed=0)
    try:
        return TeamLayout.of(probe)
    finally:
        getattr(probe, "close", lambda: None)()


def task_gpu() -> float:
    """GPUs (the ``GPU`` Dask resource) held by the Dask task running this code (0 outside
    a worker, or for a task without that resource).

    Examples
    --------
    >>> task_gpu()
    0.0
    """
    from daskrl.compat import current_task_resources

    return float(current_task_resources().get("GPU", 0))


def task_device(requested: str = "auto") -> str:
    """The device an actor or learner built inside a Dask task should use.

    ``"auto"``: ``"cuda"`` when the running task holds a ``GPU`` resource (:func:`task_gpu`)
    and torch sees a GPU, else ``"cpu"``. ``"cpu"``/``"cuda"`` are taken as given
    (``"cuda"`` must be available).

    Examples
    --------
    >>> task_device("auto"), task_device("cpu")
    ('cpu', 'cpu')
    """
    if requested not in ("auto", "cpu") and not requested.startswith("cuda"):
        raise ValueError(f"device={requested!r}: use auto, cpu or cuda")
    if requested.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device={requested!r} but torch sees no GPU: use --device auto or cpu")
    if requested != "auto":
        return requested
    from daskrl.core.roles import pick_device

    return pick_device(task_gpu())
