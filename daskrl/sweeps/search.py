"""``--search optuna``: configurations proposed by Optuna (TPE or random sampling), each
trained as a trial of the sweep; trials whose periodic evaluations fall below the median
of earlier trials at the same step (the multiple of ``--eval-every`` each was due at) are
stopped early (Optuna's ``MedianPruner``).

The study lives in ``OUT/optuna.journal`` (Optuna's journal file storage), so a resumed
sweep goes on with the same study: finished and pruned trials stay told, and the trials
that were running train on from their checkpoints.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from daskrl.core.script import MissingExtra
from daskrl.sweeps.runner import Job, TrialPool, eval_rows
from daskrl.sweeps.spec import Dimension, Trial, folder_name
from daskrl.sweeps.state import DONE, SweepState

SAMPLERS = ("tpe", "random")
PRUNERS = ("median", "none")
STUDY = "daskrl-sweep"


def optuna_module() -> Any:
    """Optuna, or one line naming the extra that installs it."""
    try:
        import optuna
    except ImportError:
        raise MissingExtra("--search optuna", "sweep", "optuna") from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # the sweep's own bar says it
    return optuna


def open_study(out: Path, sampler: str, pruner: str, seed: int, startup: int) -> Any:
    """The sweep's study in ``OUT/optuna.journal`` (created, or loaded on resume).

    ``startup``: trials that finish before the pruner may stop any (Optuna's
    ``n_startup_trials``); a trial is never pruned at its first evaluation.
    """
    optuna = optuna_module()
    storage = optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(out / "optuna.journal")))
    samplers = {"tpe": lambda: optuna.samplers.TPESampler(seed=seed),
                "random": lambda: optuna.samplers.RandomSampler(seed=seed)}
    pruners = {"median": lambda: optuna.pruners.MedianPruner(n_startup_trials=startup,
                                                             n_warmup_steps=1),
               "none": optuna.pruners.NopPruner}
    return optuna.create_study(study_name=STUDY, storage=storage, direction="maximize",
                               sampler=samplers[sampler](), pruner=pruners[pruner](),
                               load_if_exists=True)


def suggest(trial: Any, space: Sequence[Dimension]) -> dict[str, Any]:
    """The trial's configuration: one value per dimension, through Optuna's ``suggest_*``."""
    values: dict[str, Any] = {}
    for dim in space:
        if dim.choices:
            values[dim.name] = trial.suggest_categorical(dim.name, list(dim.choices))
        elif dim.integer:
            values[dim.name] = trial.suggest_int(dim.name, int(dim.low), int(dim.high),
                                                 log=dim.log)
        else:
            values[dim.name] = trial.suggest_float(dim.name, dim.low, dim.high, log=dim.log)
    return values


class Search:
    """Optuna's study driving a :class:`~daskrl.sweeps.runner.TrialPool`.

    Parameters
    ----------
    study : optuna.Study
        From :func:`open_study`.
    space : sequence of Dimension
        What is searched.
    trials : int
        Trials in all (those of an earlier, resumed session count).
    seed : int
        Every trial's seed: configurations are compared on the same seed.
    state : SweepState
        ``sweep.json``.
    enqueue : sequence of dict
        Configurations to try first (the graph's defaults, a known good one), in order;
        Optuna's ``enqueue_trial``. Only a new study takes them.
    """

    def __init__(self, study: Any, space: Sequence[Dimension], trials: int, seed: int,
                 state: SweepState, enqueue: Sequence[Mapping[str, Any]] = ()) -> None:
        self.study, self.space, self.trials, self.seed = study, space, trials, seed
        self.state = state
        self.live: dict[str, Any] = {}  # trial name -> its optuna.Trial
        self.optuna = optuna_module()
        if not study.trials:
            for params in enqueue:
                study.enqueue_trial(dict(params))

    def jobs(self) -> Iterator[Job]:
        """Trials left running by an earlier session first (from their checkpoints), then
        new ones asked of the study until ``trials`` exist."""
        by_number = {t.number: t for t in self.study.trials}
        for name, rec in self.state.trials.items():
            if rec["state"] in DONE:
                continue
            frozen = by_number.get(rec.get("optuna_trial"))
            if frozen is None or frozen.state != self.optuna.trial.TrialState.RUNNING:
                continue
            # the running trial of an earlier session, by its id (Optuna keeps no other handle)
            self.live[name] = self.optuna.trial.Trial(self.study, frozen._trial_id)
            yield Job(Trial(name, dict(rec["config"]), rec["seed"]), resume=True)
        waiting = self.optuna.trial.TrialState.WAITING  # enqueued, not yet asked for
        while sum(t.state != waiting for t in self.study.trials) < self.trials:
            trial = self.study.ask()
            config = suggest(trial, self.space)
            name = folder_name(trial.number, config, self.seed)
            self.state.add(name, config, self.seed, optuna_trial=trial.number)
            self.live[name] = trial
            yield Job(Trial(name, config, self.seed))

    def watch(self, pool: TrialPool, job: Job) -> None:
        """Report the trial's new evaluations to Optuna; prune it when the pruner says so."""
        trial = self.live[job.trial.name]
        told = job.seen.setdefault("reported", set())
        every = int(pool.state.data["definition"].get("eval_every") or 0)
        for iteration, value in eval_rows(pool.state.out / job.trial.name):
            step = eval_step(iteration, every)
            if step not in told:
                told.add(step)
                trial.report(value, step=step)
        if told and trial.should_prune():
            pool.prune(job)

    def ended(self, job: Job) -> None:
        """Tell the study how the trial ended (a stopped one stays running, to resume)."""
        rec = self.state.trials[job.trial.name]
        trial = self.live.pop(job.trial.name)
        states = self.optuna.trial.TrialState
        if rec["state"] == "finished" and isinstance(rec.get("eval_return_mean"), (int, float)):
            self.study.tell(trial, rec["eval_return_mean"])
        elif rec["state"] == "pruned":
            self.study.tell(trial, state=states.PRUNED)
        elif rec["state"] in ("failed", "finished"):  # finished without an evaluation
            self.study.tell(trial, state=states.FAIL)

    def best(self) -> dict[str, Any] | None:
        """The best finished trial: its number, value and configuration."""
        try:
            best = self.study.best_trial
        except ValueError:  # none finished
            return None
        return {"optuna_trial": best.number, "eval_return_mean": best.value,
                "config": best.params}


def eval_step(iteration: int, every: int) -> int:
    """The step a periodic evaluation is reported to Optuna at: the multiple of ``every``
    it was due at. Where short iterations share a task, the evaluated weights are those of
    the task's last iteration (11 for the one due at 10), and which iterations share a
    task differs between trials; the median pruner compares trials at equal steps only.

    Examples
    --------
    >>> eval_step(11, 10), eval_step(20, 10), eval_step(7, 0)
    (10, 20, 7)
    """
    return iteration - iteration % every if every > 0 else iteration


def eval_interval(eval_every: int, iterations: int, pruner: str) -> int:
    """Periodic evaluations for the pruner: the user's, or about eight per trial.

    Examples
    --------
    >>> eval_interval(5, 100, "median"), eval_interval(0, 4, "none")
    (5, 0)
    """
    if pruner == "none" or eval_every > 0:
        return eval_every
    every = max(1, iterations // 8)
    print(f"--search: evaluating every {every} iterations for the median pruner "
          "(--eval-every sets it)", file=sys.stderr)
    return every
