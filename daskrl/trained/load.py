"""A finished run loaded back: its algorithm rebuilt from the saved graph and config, and the
policy weights of its last (or a chosen, or the best) checkpoint."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from daskrl.core.algorithm import Algorithm, Weights
from daskrl.core.script import UserError, load_graph
from daskrl.observe.metrics import read_summary
from daskrl.runtime.checkpoint import list_checkpoints
from daskrl.trained.config import config_from_dict

__all__ = ["Policy", "TrainedRun", "load_policy", "load_run", "obs_shape", "obs_spec"]


@dataclass(frozen=True)
class TrainedRun:
    """A finished (or interrupted) run, ready to act.

    Examples
    --------
    >>> run = load_run("runs/ppo-20260101-000000")  # doctest: +SKIP
    >>> run.policy()(np.zeros((2, 4), np.float32))  # doctest: +SKIP
    array([0, 1])
    """

    out: Path
    """The run's folder (``--out``)."""
    algo: Algorithm
    """The algorithm rebuilt from the run's graph script and config."""
    weights: Weights
    """The policy weights of :attr:`checkpoint`."""
    checkpoint: Path
    """The checkpoint the weights come from."""
    summary: dict[str, Any] = field(default_factory=dict)
    """``summary.json`` (empty for a run that has not finished)."""
    iteration: int = 0
    """Iterations done when :attr:`checkpoint` was written."""

    def module(self, deterministic: bool = True) -> torch.nn.Module:
        """The policy as a module: ``forward(obs batch) -> action batch`` (eval mode)."""
        if self.algo.make_policy is None:
            raise ValueError(f"{self.out}: the {self.algo.name!r} algorithm has no make_policy, "
                             "so its policy cannot be evaluated or exported; set "
                             "Algorithm(make_policy=...) in its graph script")
        return self.algo.make_policy(self.weights, deterministic).eval()

    def policy(self, deterministic: bool = True) -> Policy:
        """The policy as a plain callable on numpy observations (see :class:`Policy`)."""
        spec = obs_spec(self.algo.env_id)
        if spec is None:
            return Policy(self.module(deterministic), None)
        dtype = torch.from_numpy(np.zeros(0, spec[1])).dtype  # the env's (uint8 frames stay)
        return Policy(self.module(deterministic), spec[0], dtype)


class Policy:
    """A trained policy called on observations: one (``obs_shape``) or a batch
    (``[B, *obs_shape]``), numpy or lists; returns numpy actions (one, or ``[B, ...]``).

    Examples
    --------
    >>> from daskrl.algos.networks import DiscreteActorCritic
    >>> pi = Policy(DiscreteActorCritic(4, 2).policy(True), (4,))
    >>> pi([0.0, 0.0, 0.0, 0.0]).shape, pi(np.zeros((5, 4))).shape
    ((), (5,))
    """

    def __init__(self, module: torch.nn.Module, obs_shape: tuple[int, ...] | None,
                 dtype: torch.dtype = torch.float32) -> None:
        self.module = module
        self.obs_shape = obs_shape
        self.dtype = dtype

    def __call__(self, obs: Any) -> np.ndarray:
        x = torch.as_tensor(np.asarray(obs), dtype=self.dtype)
        single = self.obs_shape is not None and tuple(x.shape) == self.obs_shape
        with torch.inference_mode():
            actions = self.module(x[None] if single else x)
        out = actions.cpu().numpy()
        return out[0] if single else out


def obs_spec(env_id: str | None) -> tuple[tuple[int, ...], np.dtype] | None:
    """One observation's shape and dtype for ``env_id`` (None without an env id).

    Examples
    --------
    >>> obs_spec("CartPole-v1")
    ((4,), dtype('float32'))
    """
    if env_id is None:
        return None
    from daskrl.core.envs import make_env

    env = make_env(env_id)  # as training saw it (Atari: preprocessed, frames stacked)
    try:
        space = env.observation_space
        return tuple(space.shape or ()), np.dtype(space.dtype)
    finally:
        env.close()


def obs_shape(env_id: str | None) -> tuple[int, ...] | None:
    """One observation's shape for ``env_id`` (None without an env id)."""
    spec = obs_spec(env_id)
    return None if spec is None else spec[0]


def _checkpoint_file(out: Path, checkpoint: str | Path | None, best: bool) -> Path:
    """Which file to load: ``checkpoint``, ``best.pt``, or the newest ``ckpt-*.pt``."""
    if checkpoint is not None and best:
        raise ValueError("pass --checkpoint FILE or --best, not both")
    if checkpoint is not None:
        path = Path(checkpoint)
        if not path.is_file() and (out / "checkpoints" / path).is_file():
            path = out / "checkpoints" / path
        if not path.is_file():
            raise FileNotFoundError(f"checkpoint {checkpoint} not found (neither as given nor "
                                    f"under {out / 'checkpoints'})")
        return path
    if best:
        path = out / "checkpoints" / "best.pt"
        if not path.is_file():
            raise FileNotFoundError(f"{path} not found: only runs trained with --eval-every N "
                                    "keep a best checkpoint")
        return path
    found = list_checkpoints(out / "checkpoints")
    if not found:
        raise FileNotFoundError(f"{out}: no checkpoints/ckpt-*.pt; pass the --out folder of a "
                                "training run that finished at least one iteration")
    return found[-1]


def _graph_module(meta: dict[str, Any], out: Path) -> Any:
    """The run's graph script, by the absolute path recorded at launch, else as given."""
    candidates = [meta.get("graph_file"), meta.get("graph")]
    for name in candidates:
        if name and Path(name).is_file():
            return load_graph(str(name))
    raise FileNotFoundError(f"{out}: the run's graph script {meta.get('graph')!r} is not found "
                            "from here; run from the folder it was trained in")


def load_run(run_dir: str | Path, checkpoint: str | Path | None = None, best: bool = False
             ) -> TrainedRun:
    """Load a run folder: its algorithm (graph script + saved config) and a checkpoint's weights.

    Parameters
    ----------
    run_dir
        The ``--out`` folder of a training run.
    checkpoint
        A checkpoint file (a path, or a name under ``run_dir/checkpoints``); default: the newest.
    best
        Load ``checkpoints/best.pt`` (kept by runs with periodic evaluation).

    Raises
    ------
    FileNotFoundError, ValueError
        One line naming what is missing or wrong.

    Examples
    --------
    >>> load_run("no/such/run")
    Traceback (most recent call last):
    ...
    FileNotFoundError: no/such/run: no such run folder; pass the --out folder of a training run
    """
    out = Path(run_dir)
    if not out.is_dir():
        raise FileNotFoundError(f"{run_dir}: no such run folder; pass the --out folder of a "
                                "training run")
    path = _checkpoint_file(out, checkpoint, best)
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
        weights = ckpt["learner"]["model"]
    except Exception as exc:  # noqa: BLE001 - any unreadable file gets the same one line
        raise ValueError(f"{path}: not a daskrl checkpoint ({type(exc).__name__}: {exc})"
                         ) from None
    summary = read_summary(out)
    meta = ckpt.get("meta") or summary
    if "config" not in meta:
        raise ValueError(f"{path}: holds no graph config (meta); it was not written by "
                         "`daskrl train`")
    try:
        module = _graph_module(meta, out)
        config = config_from_dict(module.Config, meta["config"], f"{path} (config)")
        algo = module.build(config)
    except UserError as exc:
        raise ValueError(str(exc)) from None
    return TrainedRun(out, algo, weights, path, summary, int(ckpt.get("iteration", 0)))


def load_policy(run_dir: str | Path, checkpoint: str | Path | None = None,
                deterministic: bool = True, best: bool = False
                ) -> Callable[[Any], np.ndarray]:
    """A run's trained policy as a callable ``obs -> action`` (one observation or a batch).

    Examples
    --------
    >>> import daskrl
    >>> pi = daskrl.load_policy("runs/ppo-20260101-000000")  # doctest: +SKIP
    >>> pi([0.0, 0.01, 0.0, -0.01])  # doctest: +SKIP
    array(1)
    """
    return load_run(run_dir, checkpoint, best).policy(deterministic)
