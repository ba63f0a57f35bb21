"""``--distribution auto``: probe the distributions an algorithm can use on the cluster it
has, and train under the fastest.

No distribution is best for every algorithm, workload and cluster (a cheap env wants one
fused task, a costly one wants its rollouts spread over workers, a slow network punishes
data-parallel's per-minibatch averaging), so ``auto`` measures instead of guessing. Each
candidate (:func:`candidates`: every distribution whose :meth:`~daskrl.distributions.base.
Distribution.check` accepts the algorithm, the graph's own first) runs a few iterations of
the real run on the real cluster through :func:`daskrl.runtime.driver.train`, in a folder
of its own that is deleted after; its steady rate is taken from ``metrics.csv``
(:func:`steady_rate`: the iterations after the first, timed on the learner's clock, so
start-up is left out). The fastest within :data:`~daskrl.runtime.redecide.NOISE` of the
best wins, the graph's own distribution first among equals (it is the one its defaults
were tuned under).

The winner's probe was the run itself cut short (the same seed, the same length for the
learning-rate schedule), so the run goes on from it (:func:`adopt`): its iterations count,
and only the other candidates' probes cost time. An off-policy learner's replay is not in
a probe's last output, so such runs start afresh.

``summary.json`` records the choice as ``distribution`` and the probe as
``distribution_probe`` (each candidate's rate, its probe's wall time, why one was skipped,
and how its updates compare with the graph's own distribution, :data:`LEARNING`). A resumed
run keeps the distribution its first start chose, from the checkpoint's record.

``--deterministic`` is refused with ``auto``: the choice depends on measured speed, which
varies between runs, and each distribution trains other bit-identical weights.
"""

from __future__ import annotations

import dataclasses
import math
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from daskrl.core.algorithm import Algorithm
from daskrl.core.failures import FragmentError, RunStopped
from daskrl.distributions import (
    KINDS,
    Distribution,
    Unsupported,
    get_distribution,
)
from daskrl.distributions.base import parse_spec
from daskrl.runtime.checkpoint import load_latest
from daskrl.runtime.engine import Backend
from daskrl.runtime.redecide import NOISE, plan_from_probe
from daskrl.runtime.settings import RunSettings

PROBE_S = 1.0
"""Seconds each candidate trains after its first iteration (which carries the start-up and
is not timed); the iterations in flight then finish too."""

LEARNING: Mapping[str, str] = {
    "single": "the same updates, every role in one task",
    "actors-learner": "the same updates (lockstep)",
    "central-inference": "the same updates; inference batched on the learner's worker",
    "data-parallel": "synchronous SGD over the replicas' minibatches: per-minibatch "
                     "statistics (advantage normalisation) are each replica's own",
    "async": "gradients applied as they arrive, on older weights (A3C)",
    "impala": "free-running actors, off-policy by the lag that V-trace corrects",
    "apex": "replay on shards of their own; actors refresh their weights every few rollouts",
}
"""How each distribution's updates compare with lockstep ``actors-learner``: what the
probe's speed buys or costs in learning (printed beside each rate)."""


@dataclasses.dataclass(frozen=True)
class Probe:
    """One candidate's probe: its rate, or why it has none."""

    spec: str
    """The distribution, as ``--distribution`` takes it."""
    env_steps_per_s: float | None = None
    """Steady env steps a second (None: not measured, see ``skipped``)."""
    probe_s: float = 0.0
    """Wall seconds the probe took, start-up included."""
    iterations: int = 0
    """Iterations it ran."""
    skipped: str | None = None
    """Why it was not measured: refused by the algorithm or the cluster, or it failed."""
    folder: Path | None = dataclasses.field(default=None, compare=False)
    """Where its run is kept (``probe(keep=True)``): the winner's run goes on from it."""

    @property
    def learning(self) -> str:
        """How its updates compare with lockstep ``actors-learner``'s."""
        return LEARNING.get(parse_spec(self.spec)[0], "")

    def record(self) -> dict[str, Any]:
        """What ``summary.json`` keeps of it."""
        return {"distribution": self.spec, "env_steps_per_s": self.env_steps_per_s,
                "probe_s": round(self.probe_s, 3), "iterations": self.iterations,
                "skipped": self.skipped, "learning": self.learning}


def refuse_deterministic(deterministic: bool) -> None:
    """One line refusing ``auto`` under ``--deterministic``.

    Examples
    --------
    >>> refuse_deterministic(False)
    >>> refuse_deterministic(True)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: --distribution auto picks by measured speed, which varies between runs: ...
    """
    if deterministic:
        raise ValueError("--distribution auto picks by measured speed, which varies between "
                         "runs: with --deterministic name the distribution (e.g. "
                         "--distribution actors-learner)")


def candidates(algo: Algorithm) -> tuple[list[str], dict[str, str]]:
    """The distributions ``algo`` can use (the graph's own first, with its options; then
    every other by name, with default options), and those it cannot, each with why.

    Examples
    --------
    >>> from daskrl.core.script import load_graph
    >>> ppo = load_graph("graphs/ppo.py")
    >>> usable, refused = candidates(ppo.build(ppo.Config(num_actors=2)))
    >>> usable
    ['actors-learner', 'central-inference', 'data-parallel', 'single']
    >>> sorted(refused)
    ['apex', 'async', 'impala']
    """
    own_name = parse_spec(algo.distribution)[0]
    specs = [algo.distribution] + [n for n in sorted(KINDS) if n != own_name]
    usable: list[str] = []
    refused: dict[str, str] = {}
    for spec in specs:
        try:
            get_distribution(spec).check(algo)
        except (Unsupported, ValueError) as exc:
            refused[spec] = str(exc)
            continue
        usable.append(spec)
    return usable, refused


def sizing(algo: Algorithm) -> Distribution:
    """The candidate that wants the most workers: what an embedded cluster is sized for
    before the probe picks (the probe runs on the cluster the run gets).

    Examples
    --------
    >>> from daskrl.core.script import load_graph
    >>> ppo = load_graph("graphs/ppo.py")
    >>> sizing(ppo.build(ppo.Config(num_actors=2))).workers_wanted(
    ...     ppo.build(ppo.Config(num_actors=2)))
    2
    """
    return max((get_distribution(s) for s in candidates(algo)[0]),
               key=lambda d: d.workers_wanted(algo))


def steady_rate(rows: Sequence[Mapping[str, float]]) -> float | None:
    """Env steps a second over a probe's iterations after the first, on the learner's clock
    (``iteration_env_steps`` over ``iteration_s``); None with fewer than two iterations.

    Examples
    --------
    >>> rows = [{"iteration_env_steps": 100, "iteration_s": 5.0},  # start-up, left out
    ...         {"iteration_env_steps": 100, "iteration_s": 0.5},
    ...         {"iteration_env_steps": 100, "iteration_s": 0.5}]
    >>> steady_rate(rows)
    200.0
    >>> steady_rate(rows[:1]) is None
    True
    """
    later = rows[1:]
    steps = sum(float(r.get("iteration_env_steps") or 0.0) for r in later)
    seconds = sum(float(r.get("iteration_s") or 0.0) for r in later)
    if not later or seconds <= 0 or not math.isfinite(seconds):
        return None
    return steps / seconds


def choose(probes: Sequence[Probe], noise: float = NOISE) -> Probe:
    """The winner: the first probe (in candidate order) within ``noise`` of the best rate.

    Examples
    --------
    >>> probes = [Probe("actors-learner", 980.0), Probe("single", 1000.0),
    ...           Probe("data-parallel", None, skipped="failed")]
    >>> choose(probes).spec  # within 5 % of the best: the graph's own stays
    'actors-learner'
    >>> choose([Probe("actors-learner", 700.0), Probe("single", 1000.0)]).spec
    'single'
    """
    measured = [p for p in probes if p.env_steps_per_s is not None]
    if not measured:
        raise RuntimeError("--distribution auto: no distribution could be probed: "
                           + "; ".join(f"{p.spec}: {p.skipped}" for p in probes))
    best = max(p.env_steps_per_s or 0.0 for p in measured)
    return next(p for p in measured if (p.env_steps_per_s or 0.0) >= (1 - noise) * best)


def probe_table(probes: Sequence[Probe], winner: Probe) -> str:
    """The probe as a table: each candidate's steady rate, its share of the winner's, the
    probe's cost, and how its updates compare; why the winner won, last.

    Examples
    --------
    >>> print(probe_table([Probe("actors-learner", 900.0, 2.0, 6),
    ...                    Probe("single", 1000.0, 1.5, 6)], Probe("single", 1000.0, 1.5, 6)))
    ... # doctest: +NORMALIZE_WHITESPACE
    distribution    env-steps/s  of best  probe s  updates
    actors-learner          900     0.90      2.0  the same updates (lockstep)
    single                1,000     1.00      1.5  the same updates, every role in one task
    auto chose single: the fastest (1,000 env-steps/s; probes took 3.5 s)
    """
    best = winner.env_steps_per_s or 1.0
    width = max(len("distribution"), *(len(p.spec) for p in probes))
    lines = [f"{'distribution':<{width}}  {'env-steps/s':>11}  {'of best':>7}  "
             f"{'probe s':>7}  updates"]
    for p in probes:
        if p.env_steps_per_s is None:
            lines.append(f"{p.spec:<{width}}  {'-':>11}  {'-':>7}  {p.probe_s:>7.1f}  "
                         f"skipped: {p.skipped}")
            continue
        lines.append(f"{p.spec:<{width}}  {p.env_steps_per_s:>11,.0f}  "
                     f"{p.env_steps_per_s / best:>7.2f}  {p.probe_s:>7.1f}  {p.learning}")
    fastest = max((p.env_steps_per_s or 0.0) for p in probes)
    why = ("the fastest" if (winner.env_steps_per_s or 0.0) >= fastest
           else f"within {NOISE:.0%} of the fastest, and earlier in the list (the graph's "
                "own distribution comes first)")
    cost = sum(p.probe_s for p in probes)
    lines.append(f"auto chose {winner.spec}: {why} ({best:,.0f} env-steps/s; probes took "
                 f"{cost:.1f} s)")
    return "\n".join(lines)


def task_hop_s(backend: Backend, chain: int = 8) -> float:
    """Seconds a task that waits on another's result costs on ``backend``'s cluster: a
    chain of ``chain`` trivial tasks, timed end to end, per task (the second of two runs,
    so the first pays for any start-up)."""
    from dask import delayed

    took = 0.0
    for _ in range(2):
        node = delayed(_same, pure=False)(0)
        for _ in range(chain - 1):
            node = delayed(_same, pure=False)(node)
        started = time.perf_counter()
        backend.fetch(backend.submit(node), 30.0)
        took = time.perf_counter() - started
    return took / chain


def _same(x: Any) -> Any:
    return x


def probe(backend: Backend, algo: Algorithm, spec: str, settings: RunSettings,
          probe_s: float = PROBE_S, keep: bool = False) -> Probe:
    """Train ``algo`` under ``spec`` on ``backend`` for ``probe_s`` seconds after its first
    iteration (and the iterations then in flight), in a temporary folder with no
    evaluation; its :class:`Probe`. The run is the one ``settings`` describe (its seed, its
    length for the learning-rate schedule), cut short; ``keep``: its folder is kept
    (:attr:`Probe.folder`, the caller removes it), so the run can go on from it."""
    from daskrl.observe.plot import read_metrics
    from daskrl.runtime.driver import train

    folder = Path(tempfile.mkdtemp(prefix="daskrl-probe-"))
    probe_settings = dataclasses.replace(
        settings, out=folder / re.sub(r"[^A-Za-z0-9_.-]", "_", spec),
        steps=max(settings.steps, 2 * algo.steps_per_iteration), resume=False, eval=False,
        eval_every=0, progress=False, tensorboard=False, checkpoint_every=10**9,
        max_restarts=0, stop_after_s=probe_s, lookahead=2, task_s=min(settings.task_s, 0.25),
        observers=(), advice=False,
        meta={**settings.meta, "probe": spec, "distribution_probe": {"chosen": spec}})
    started = time.perf_counter()
    try:
        train(backend, algo, get_distribution(spec), probe_settings)
        columns = read_metrics(probe_settings.out)
    except (ValueError, RunStopped, FragmentError, RuntimeError, TimeoutError) as exc:
        shutil.rmtree(folder, ignore_errors=True)
        reason = " ".join(str(exc).split())
        return Probe(spec, None, time.perf_counter() - started, 0,
                     reason[:200] + ("..." if len(reason) > 200 else ""))
    if not keep:
        shutil.rmtree(folder, ignore_errors=True)
    rows = [dict(zip(columns, values, strict=True)) for values in zip(*columns.values(),
                                                                        strict=True)]
    return Probe(spec, steady_rate(rows), time.perf_counter() - started, len(rows),
                 None if len(rows) > 1 else "too few iterations to time",
                 probe_settings.out if keep else None)


def probe_all(backend: Backend, algo: Algorithm, settings: RunSettings,
              specs: Iterable[str] | None = None, probe_s: float = PROBE_S,
              echo: bool = True, keep: bool = False) -> list[Probe]:
    """Probe each of ``specs`` (default: :func:`candidates`), the first first and then the
    others by their task floor (:meth:`~daskrl.distributions.base.Distribution.
    task_floor_s`), cheapest first. A candidate whose floor alone is slower than the best
    rate measured so far (by more than :data:`~daskrl.runtime.redecide.NOISE`) is skipped,
    with the numbers; those the algorithm refuses are listed as skipped, with why."""
    usable, refused = candidates(algo) if specs is None else (list(specs), {})
    hop = task_hop_s(backend)
    floors = {spec: get_distribution(spec).task_floor_s(algo, hop) for spec in usable}
    order = usable[:1] + sorted(usable[1:], key=lambda s: floors[s])
    probes: list[Probe] = []
    for spec in order:
        best = max((p.env_steps_per_s or 0.0 for p in probes), default=0.0)
        if best > 0 and floors[spec] > 0:
            ceiling = algo.steps_per_iteration / floors[spec]
            if ceiling < (1 - NOISE) * best:
                probes.append(Probe(spec, skipped=(
                    f"its chain of tasks alone takes {floors[spec]:.2f} s an iteration "
                    f"({hop * 1e3:.1f} ms a task here): at most {ceiling:,.0f} env-steps/s")))
                continue
        if echo:
            print(f"daskrl: probing --distribution {spec} ({probe_s:g} s)", file=sys.stderr)
        probes.append(probe(backend, algo, spec, settings, probe_s, keep))
    return probes + [Probe(spec, skipped=_short(why)) for spec, why in refused.items()]


def _short(why: str) -> str:
    """A refusal's reason, shortened to what is missing.

    Examples
    --------
    >>> _short("the 'apex' distribution needs the 'replay' capability, which 'ppo' does "
    ...        "not declare (a replay buffer): pick another --distribution")
    "needs the 'replay' capability"
    """
    found = re.search(r"needs the '[^']+' capability", why)
    return found.group(0) if found else why[:200]


def resolve(backend: Backend, algo: Algorithm, settings: RunSettings,
            specs: Iterable[str] | None = None, probe_s: float = PROBE_S,
            redecide: bool = True) -> tuple[Distribution, RunSettings]:
    """The distribution ``auto`` picks for this run, and the settings that record why.

    A resumed run keeps the choice its checkpoint records (the latest re-decision's);
    otherwise every candidate is probed, the table printed (stderr) and the probe put in
    ``settings.meta`` (whence ``summary.json`` and every checkpoint take it). ``redecide``:
    the run may switch between the measured candidates while it goes on
    (:attr:`RunSettings.redecide`, :mod:`daskrl.runtime.redecide`).
    """
    refuse_deterministic(settings.deterministic)
    if settings.resume:
        ckpt = load_latest(settings.out / "checkpoints") or {}
        before = (ckpt.get("meta") or {}).get("distribution_probe")
        if before:
            now = before.get("now") or before["chosen"]
            said = "the run last switched to" if before.get("now") else "its probe chose"
            print(f"daskrl: --distribution auto: resuming under {now}, the distribution "
                  f"{said}", file=sys.stderr)
            return get_distribution(now), dataclasses.replace(
                settings, meta={**settings.meta, "distribution_probe": before},
                redecide=plan_from_probe(before) if redecide else None)
    probes = probe_all(backend, algo, settings, specs, probe_s, keep=True)
    try:
        winner = choose(probes)
        print(probe_table(probes, winner), file=sys.stderr)
        # a light-state learner's replay is not in the probe's last output: start afresh
        light = "light-state" in algo.capabilities
        adopted = adopt(winner.folder, settings.out) if winner.folder and not light else 0
    finally:
        for p in probes:
            if p.folder is not None:
                shutil.rmtree(p.folder.parent, ignore_errors=True)
    record = {"chosen": winner.spec, "probe_s": round(sum(p.probe_s for p in probes), 3),
              "probe_s_each": probe_s, "noise": NOISE, "iterations_kept": adopted,
              "workers": len(backend.identities()),
              "candidates": [p.record() for p in probes]}
    meta = {**settings.meta, "distribution_probe": record}
    if adopted:
        print(f"daskrl: the run goes on from the {adopted} iterations of its "
              f"{winner.spec} probe", file=sys.stderr)
    return get_distribution(winner.spec), dataclasses.replace(
        settings, meta=meta, resume=settings.resume or adopted > 0,
        redecide=plan_from_probe(record) if redecide else None)


def adopt(probe_out: Path, out: Path) -> int:
    """Make the winner's probe the start of the run in ``out``: its metrics rows and its
    checkpoint (the probe was the run itself, cut short: the same seed and length) move
    there, so the run resumes from it and the probe's iterations are not lost. Returns the
    iterations taken over (0 when the probe left no checkpoint, or ``out`` holds files a
    run would not overwrite).

    Examples
    --------
    >>> import tempfile
    >>> adopt(Path(tempfile.mkdtemp()) / "probe", Path(tempfile.mkdtemp()) / "run")
    0
    """
    from daskrl.runtime.driver import finished_iterations

    done = finished_iterations(probe_out) if probe_out.is_dir() else 0
    if done == 0 or (out.exists() and any(out.iterdir())):
        return 0
    out.mkdir(parents=True, exist_ok=True)
    for name in ("metrics.csv", "checkpoints", "config.yaml"):
        if (probe_out / name).exists():
            shutil.move(str(probe_out / name), str(out / name))
    return done
