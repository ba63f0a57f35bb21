"""``--pbt``: population-based training (Jaderberg et al., 2017).

The members train in rounds of ``interval`` iterations, side by side on the cluster; each
round ends with a pause (a checkpoint and a greedy evaluation: the member's fitness).
Then the bottom ``quantile`` of the population each copies the checkpoint of a member of
the top ``quantile`` (weights, optimiser state, normalisation, counters: *exploit*) and
moves each searched setting from that member's value by a factor of 0.8 or 1.2, held
inside its range (*explore*), and every member trains on from its checkpoint under its
new settings. Only the settings a graph declares in ``Config.MID_RUN`` may be searched:
those a learner rebuilt from a checkpoint takes as they are (a learning rate, a loss
coefficient), not those that shape networks or envs.

Every copy is recorded in ``sweep.json``'s ``lineage``: the round, the iteration, who
copied whom, both fitnesses and the settings before and after.
"""

from __future__ import annotations

import math
import os
import shutil
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from daskrl.runtime.checkpoint import list_checkpoints
from daskrl.sweeps.runner import Job, TrialPool
from daskrl.sweeps.spec import Dimension, Trial, folder_name
from daskrl.sweeps.state import SweepState

PERTURB = (0.8, 1.2)
"""Factors a copied setting is multiplied by (one drawn per setting)."""


def check_mid_run(config_cls: type, space: Sequence[Dimension]) -> None:
    """Refuse searched settings the graph does not declare changeable mid-run.

    Examples
    --------
    >>> class Config:
    ...     MID_RUN = ("learning_rate",)
    >>> check_mid_run(Config, [Dimension("hidden", choices=(32, 64))])
    Traceback (most recent call last):
    ...
    ValueError: --pbt cannot change 'hidden' mid-run: the graph's Config.MID_RUN declares ...
    """
    allowed = tuple(getattr(config_cls, "MID_RUN", ()))
    if not allowed:
        raise ValueError("--pbt: the graph's Config declares no MID_RUN settings (those a "
                         "learner takes as they are when resumed from a checkpoint)")
    for dim in space:
        if dim.name not in allowed:
            raise ValueError(f"--pbt cannot change {dim.name!r} mid-run: the graph's "
                             f"Config.MID_RUN declares {sorted(allowed)}")


def explore(config: Mapping[str, Any], space: Sequence[Dimension], rng: np.random.Generator
            ) -> dict[str, Any]:
    """``config`` with each searched setting moved by a factor of :data:`PERTURB` (a choice
    setting: to a neighbouring choice), held inside its range.

    Examples
    --------
    >>> dim = Dimension("learning_rate", low=1e-4, high=1e-3, log=True)
    >>> new = explore({"learning_rate": 1e-3}, [dim], np.random.default_rng(0))
    >>> new["learning_rate"] in (8e-4, 1e-3)
    True
    """
    new = dict(config)
    for dim in space:
        value = config[dim.name]
        if dim.choices:
            i = dim.choices.index(value) if value in dim.choices else 0
            step = int(rng.choice((-1, 1)))
            new[dim.name] = dim.choices[min(len(dim.choices) - 1, max(0, i + step))]
        else:
            new[dim.name] = dim.clip(value * float(rng.choice(PERTURB)))
    return new


def copy_checkpoint(donor: Path, member: Path) -> str:
    """Make ``donor``'s newest checkpoint ``member``'s only one; its file name."""
    files = list_checkpoints(donor / "checkpoints")
    if not files:
        raise FileNotFoundError(f"{donor}: no checkpoint to copy")
    source = files[-1]
    target_dir = member / "checkpoints"
    tmp = target_dir / f".{source.name}.copy"
    shutil.copyfile(source, tmp)
    os.replace(tmp, target_dir / source.name)  # the member is never without a checkpoint
    for old in list_checkpoints(target_dir):
        if old.name != source.name:
            old.unlink()
    return source.name


class Population:
    """The members, their settings and the rounds.

    Parameters
    ----------
    state : SweepState
        ``sweep.json`` (members, ``round``, ``lineage``).
    space : sequence of Dimension
        The searched settings (each member starts from a draw).
    size : int
        Members.
    interval : int
        Iterations per round.
    iterations : int
        The run's iterations (the last round ends with them).
    seed : int
        Member ``i`` trains with seed ``seed + i``; the draws are seeded by it.
    quantile : float
        Share of the population copied (bottom) and copied from (top).
    start : sequence of dict, optional
        The members' first settings, cycled (member ``i`` takes ``start[i % len(start)]``);
        a setting of ``space`` they leave out is drawn from it.
    """

    def __init__(self, state: SweepState, space: Sequence[Dimension], size: int,
                 interval: int, iterations: int, seed: int, quantile: float = 0.25,
                 start: Sequence[Mapping[str, Any]] = ()) -> None:
        self.state, self.space, self.interval = state, list(space), interval
        self.iterations, self.seed, self.quantile = iterations, seed, quantile
        self.rounds = math.ceil(iterations / interval)
        rng = np.random.default_rng(seed)
        for i in range(size):
            config = {dim.name: _plain(dim.sample(rng)) for dim in self.space}
            if start:
                config.update(start[i % len(start)])
            self.state.add(folder_name(i, {}, seed + i), config, seed + i, round=0,
                           initial_config=config)
        if "round" not in self.state.data:
            self.state.set("round", 0)

    @property
    def members(self) -> list[str]:
        return list(self.state.trials)

    def train(self, pool: TrialPool) -> None:
        """Every round left: train the members to its end, then exploit and explore."""
        while self.state.data["round"] < self.rounds:
            r = self.state.data["round"]
            pool.run(self._jobs(r), ended=self._ended)
            if r + 1 < self.rounds:
                self._exploit(r)
            self.state.set("round", r + 1)

    def _pause(self, r: int) -> int | None:
        end = (r + 1) * self.interval
        return end if end < self.iterations else None

    def _jobs(self, r: int) -> Iterator[Job]:
        for name in self.members:
            rec = self.state.trials[name]
            if rec.get("round", 0) > r or rec["state"] in ("failed", "finished"):
                continue  # this round is done for it (a resumed sweep), or it failed
            yield Job(Trial(name, dict(rec["config"]), rec["seed"]), resume=r > 0,
                      pause_at=self._pause(r))

    def _ended(self, job: Job) -> None:
        """A member that reached the round's end is one round further (kept on resume)."""
        rec = self.state.trials[job.trial.name]
        if rec["state"] in ("paused", "finished"):
            self.state.update(job.trial.name, round=rec.get("round", 0) + 1)

    def _exploit(self, r: int) -> None:
        """Bottom members copy a top member's checkpoint and move its settings."""
        fit = {n: self.state.trials[n].get("eval_return_mean") for n in self.members
               if self.state.trials[n]["state"] == "paused"}
        fit = {n: v for n, v in fit.items() if isinstance(v, (int, float)) and math.isfinite(v)}
        ranked = sorted(fit, key=lambda n: fit[n])
        count = max(1, int(len(ranked) * self.quantile)) if len(ranked) >= 2 else 0
        bottom, top = ranked[:count], ranked[len(ranked) - count:]
        rng = np.random.default_rng([self.seed, r])
        lineage = list(self.state.data.get("lineage", []))
        for name in bottom:
            donor = top[int(rng.integers(len(top)))]
            before = dict(self.state.trials[name]["config"])
            after = {k: _plain(v) for k, v in explore(self.state.trials[donor]["config"],
                                                      self.space, rng).items()}
            file = copy_checkpoint(self.state.out / donor, self.state.out / name)
            lineage.append({"round": r, "iteration": (r + 1) * self.interval,
                            "member": name, "copied": donor, "checkpoint": file,
                            "member_return": fit[name], "donor_return": fit[donor],
                            "before": before, "after": after})
            self.state.update(name, config=after, compute_at_checkpoint=self.state.trials[
                donor].get("compute_at_checkpoint", 0.0))
        self.state.set("lineage", lineage)


def _plain(value: Any) -> Any:
    return value.item() if isinstance(value, np.generic) else value
