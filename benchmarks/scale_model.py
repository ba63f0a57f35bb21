"""Scale on paper: a model of each distribution's iteration, fitted to the scale lab's runs,
that says at how many actors (and on how many actor cores) it saturates.

An iteration of N actors moves ``N x envs x steps`` env steps. Its parts, each fitted as
``a + b N`` by least squares to the measured runs (``benchmarks/results/scale_actors.json``,
steady state, per iteration):

- ``rollout``: one rollout's wall time (the sleeping steps plus the actor's own work);
- ``learner``: the learner's busy seconds (its updates, from ``learner_busy``);
- ``scheduler``: the scheduler process's CPU seconds (tasks, variables, transfers);
- ``actors``: the actor processes' CPU seconds, per process (a process's threads share one
  interpreter lock, so each process does at most a core's worth);
- ``overhead`` (lockstep only): what is left of the iteration beyond rollout + learner.

How they add up depends on the distribution: free-running ``impala`` overlaps them
(``iteration = max(rollout, learner, scheduler, actors)``), lockstep ``actors-learner``
runs a rollout, then the update (``rollout + learner + overhead``), ``apex`` overlaps the
learner with the next rollouts (``max(rollout, learner) + overhead``). The actor count where a
part first takes longer than the rollout is where that part saturates the distribution: more
actors add no env steps per second. The largest actor count measured is held out of the fit
and predicted, to check the model.

    python benchmarks/scale_model.py --json benchmarks/results/scale_actors.json \\
        benchmarks/results/scale_actors_1024.json
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

import numpy as np
from _common import markdown_table, update_section, write_json

HERE = Path(__file__).resolve().parent
PARTS = ("rollout", "learner", "scheduler", "actors", "overhead")


def parts(row: dict[str, Any]) -> dict[str, float]:
    """The measured parts of one summary row, in seconds per iteration."""
    it = float(row["iteration_s"])
    procs = max(1, int(row.get("actor_procs") or 2))
    learner = float(row.get("learner_busy") or 0.0) * it
    rollout = float(row.get("rollout_s") or 0.0)
    return {"rollout": rollout, "learner": learner,
            "scheduler": float(row.get("scheduler_cpu_share") or 0.0) * it,
            "actors": float(row.get("actors_cpu_share") or 0.0) * it / procs,
            "overhead": max(0.0, it - rollout - learner)}


def combine(kind: str, p: dict[str, float]) -> float:
    """An iteration's wall time from its parts, as ``kind`` overlaps them."""
    if kind == "free-running":
        return max(p["rollout"], p["learner"], p["scheduler"], p["actors"])
    if kind == "overlapped":
        return max(p["rollout"], p["learner"]) + p["overhead"]
    return p["rollout"] + p["learner"] + p["overhead"]


def kind_of(distribution: str) -> str:
    """How a distribution overlaps an iteration's parts.

    Examples
    --------
    >>> kind_of("impala:group=16,batch=auto"), kind_of("apex"), kind_of("actors-learner")
    ('free-running', 'overlapped', 'lockstep')
    """
    name = distribution.split(":")[0]
    return {"impala": "free-running", "apex": "overlapped"}.get(name, "lockstep")


def fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares ``(a, b)`` of ``y = a + b x`` (b = 0 from a single point).

    Examples
    --------
    >>> [round(v, 9) for v in fit([1, 2, 3], [3, 5, 7])]
    [1.0, 2.0]
    """
    if len(xs) < 2:
        return (ys[0] if ys else 0.0), 0.0
    b, a = np.polyfit(np.asarray(xs, float), np.asarray(ys, float), 1)
    return float(a), float(b)


def saturation(line: tuple[float, float], rollout: tuple[float, float]) -> float | None:
    """The actor count where ``line`` overtakes the rollout's time (None: never, for a part
    that grows no faster than the rollout).

    Examples
    --------
    >>> saturation((0.0, 0.01), (0.32, 0.0))
    32.0
    """
    (a, b), (ra, rb) = line, rollout
    if b <= rb:
        return None if a <= ra else 0.0
    return max(0.0, (ra - a) / (b - rb))


def model(rows: list[dict[str, Any]], hold_out: int | None = None) -> list[dict[str, Any]]:
    """Per distribution: the fitted parts, where each saturates, and the prediction of the
    held-out actor count (default: the largest measured) against its measurement."""
    out = []
    for system in sorted({r["distribution"] for r in rows}):
        mine = sorted((r for r in rows if r["distribution"] == system and r.get("iteration_s")),
                      key=lambda r: r["actors"])
        if len(mine) < 2:
            continue
        held = hold_out if hold_out is not None else mine[-1]["actors"]
        train = [r for r in mine if r["actors"] != held]
        test = [r for r in mine if r["actors"] == held]
        xs = [float(r["actors"]) for r in train]
        measured = [parts(r) for r in train]
        lines = {p: fit(xs, [m[p] for m in measured]) for p in PARTS}
        kind = kind_of(system)
        sat = {p: saturation(lines[p], lines["rollout"])
               for p in ("learner", "scheduler", "actors")}
        binding = min(((n, p) for p, n in sat.items() if n is not None), default=(None, None))
        row: dict[str, Any] = {"distribution": system, "kind": kind,
                               "fitted_on": [int(x) for x in xs], "held_out": held,
                               "lines": {p: {"a": a, "b": b} for p, (a, b) in lines.items()},
                               "saturates_at": sat, "limit": binding[1],
                               "limit_actors": binding[0]}
        if test:
            t = test[0]
            predicted = {p: a + b * held for p, (a, b) in lines.items()}
            it = combine(kind, predicted)
            steps = float(t["env_steps_per_s"]) * float(t["iteration_s"])  # per iteration
            row.update(predicted_iteration_s=it, measured_iteration_s=float(t["iteration_s"]),
                       predicted_env_steps_per_s=steps / it if it > 0 else None,
                       measured_env_steps_per_s=float(t["env_steps_per_s"]),
                       error=it / float(t["iteration_s"]) - 1)
            # actor cores that would keep the actors' part under the rollout's at that size
            row["actor_cores_needed"] = (predicted["actors"] * int(t.get("actor_procs") or 2)
                                         / max(predicted["rollout"], 1e-9))
        out.append(row)
    return out


def table(models: list[dict[str, Any]]) -> str:
    """The markdown table of the fitted models."""
    headers = ["distribution", "fitted on", "limit", "saturates at (actors)", "held out",
               "predicted s/it", "measured s/it", "error", "actor cores needed"]
    body = []
    for m in models:
        body.append([m["distribution"], ", ".join(map(str, m["fitted_on"])), m["limit"] or "-",
                     m["limit_actors"] if m["limit_actors"] is not None else math.inf,
                     m["held_out"], m.get("predicted_iteration_s"),
                     m.get("measured_iteration_s"),
                     f"{100 * m['error']:+.0f} %" if m.get("error") is not None else "-",
                     m.get("actor_cores_needed")])
    return markdown_table(headers, body, align="llllrrrrr")


def latest_rows(files: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """The rows of several results files together; a (distribution, actors) measured in more
    than one keeps the later file's row (a re-measured point replaces the earlier one).

    Examples
    --------
    >>> old = [{"distribution": "impala", "actors": 16, "of_ideal": 0.7}]
    >>> new = [{"distribution": "impala", "actors": 16, "of_ideal": 0.9}]
    >>> latest_rows([old, new])
    [{'distribution': 'impala', 'actors': 16, 'of_ideal': 0.9}]
    """
    kept: dict[tuple[str, int], dict[str, Any]] = {}
    for rows in files:
        for row in rows:
            kept[(row["distribution"], int(row["actors"]))] = row
    return list(kept.values())


def main(argv: list[str] | None = None) -> None:
    """Fit the model to a scale_actors.py JSON; write its table and JSON."""
    import json

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, nargs="+",
                        default=[HERE / "results" / "scale_actors.json"],
                        help="scale_actors.py's results (several: their rows together)")
    parser.add_argument("--hold-out", type=int, default=None,
                        help="actor count to predict rather than fit (default: the largest)")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "scale_model.json")
    parser.add_argument("--md", type=Path, default=HERE / "scale_actors.md")
    parser.add_argument("--section", default="scale-model",
                        help="name of the section of --md to rewrite")
    args = parser.parse_args(argv)
    rows = latest_rows([json.loads(path.read_text())["rows"] for path in args.json])
    models = model(rows, args.hold_out)
    write_json(args.out, {"source": [str(p) for p in args.json], "models": models})
    update_section(args.md, args.section, table(models))
    print(table(models))


if __name__ == "__main__":
    main()
