"""The learning regression suite: algorithm x env x seeds, each beside a peer with the same
settings, reported the way RL papers do (rliable's interquartile mean with 95 % stratified
bootstrap intervals, learning curves with bands).

Each row trains ``daskrl train GRAPH`` (the embedded cluster, the graph's default
distribution) and its peer -- Stable-Baselines3 with the same settings through
``_learning_sb3.py``, or another daskrl run where SB3 has no such algorithm -- for every
seed. The score of a run is its final greedy evaluation (``summary.json``'s
``eval_return_mean``: 10 episodes on fresh envs, MAPPO 100; SB3 plays the same episodes). A
row **trails** when daskrl's IQM lies below the lower end of the peer's interval, is **ahead**
when daskrl's interval lies wholly above the peer's, and **holds** otherwise. Runs live under
``--work`` as ``ROW/SYSTEM-sSEED``; a run whose ``summary.json`` is there from the same command
and spec is read, not run again, so the suite resumes where it stopped (a run cut short, or
one whose settings changed since, runs again), and ``--parallel`` runs go at once (the
returns of lockstep algorithms do not depend on the load; the speed columns do). The JSON
keeps each finished run's score, speed and training curve, so a later call adds seeds or rows
to it without the earlier runs' folders; ``--fresh`` forgets what it records of the rows and
seeds asked.

    python benchmarks/learning.py                          # every row, seeds 1-5
    python benchmarks/learning.py --rows ppo-cartpole dqn-cartpole --seeds 1 2 3
    python benchmarks/learning.py --no-run                 # the report of what has run
    python benchmarks/learning.py --rows mappo-spread --seeds 5   # one more seed of one row
    python benchmarks/learning.py --quick                  # a smoke: two rows, tiny budgets
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from _common import (
    ROOT,
    finished_runs,
    load_average,
    machine_info,
    markdown_table,
    run_all,
    run_or_read,
    update_section,
    write_json,
)
from _learning_rows import QUICK_STEPS, ROWS, Row, run_dir, source_row

from daskrl.sweeps.report import CURVE_POINTS, curve_points, iqm_band, iqm_interval

HERE = Path(__file__).resolve().parent


def command(row: Row, system: str, seed: int, steps: int, out: Path
            ) -> tuple[list[str], dict[str, str]]:
    """The process that trains one run into ``out``, and the files it reads there (an SB3
    peer's spec)."""
    if system == "peer" and row.sb3:
        spec = {**row.sb3, "env": row.env, "steps": steps, "seed": seed}
        return ([sys.executable, str(HERE / "_learning_sb3.py"), str(out / "spec.json"),
                 str(out)], {"spec.json": json.dumps(spec, indent=1)})
    flags = row.flags if system == "daskrl" else row.peer_flags
    return [sys.executable, "-m", "daskrl", "train", row.graph, *flags, "--steps", str(steps),
            "--seed", str(seed), "--no-progress", "--out", str(out)], {}


def run_one(row: Row, system: str, seed: int, steps: int, work: Path, may_run: bool
            ) -> dict[str, Any]:
    """Run (unless already run, or ``may_run`` is off) and read one run."""
    row = source_row(row, system)
    out = run_dir(work, row, system, seed)
    record: dict[str, Any] = {"row": row.name, "system": system, "seed": seed, "steps": steps,
                              "dir": str(out)}
    cmd, files = command(row, system, seed, steps, out)
    got = run_or_read(cmd, out, may_run, files)
    if "summary" not in got:
        return record | got
    return record | {"final_eval": got["summary"].get("eval_return_mean"),
                     "env_steps_per_s": got["summary"].get("env_steps_per_s"),
                     "load_before": got["load_before"], "curve": run_curve(out)}


def run_curve(out: Path, points: int = 2 * CURVE_POINTS) -> list[list[float]] | None:
    """One run's training return at ``points`` evenly spaced env steps, ``[steps, returns]``
    (what the JSON keeps of ``metrics.csv``); None without two logged returns."""
    got = curve_points([out], points)
    if got is None:
        return None
    return [[float(x) for x in got[0]], [round(float(x), 4) for x in got[1][0]]]


def recorded(path: Path) -> dict[tuple[str, str, int, int | None], dict[str, Any]]:
    """The finished runs an earlier call recorded in ``path`` (none if it is not there), by
    (row, system, seed, steps). Runs recorded before the JSON named their steps ran their
    row's budget: the suite's own JSON holds full runs only (``--quick`` writes elsewhere).

    >>> recorded(Path("no-such.json"))
    {}
    """
    kept = {}
    for r in finished_runs(path):
        if r.get("row") in ROWS:
            r.setdefault("steps", ROWS[r["row"]].steps)
        kept[(r["row"], r["system"], r["seed"], r.get("steps"))] = r
    return kept


def summarise(row: Row, runs: list[dict[str, Any]], steps: int, reps: int | None = None
              ) -> dict[str, Any]:
    """The row's scores per system: finals, IQM with its interval (``reps`` bootstrap
    resamples; default: ``$DASKRL_BOOTSTRAP_REPS`` or 20,000), and the verdict."""
    out: dict[str, Any] = {"row": row.name, "algo": row.algo, "env": row.env,
                           "steps": steps, "peer_name": row.peer, "note": row.note}
    for system in ("daskrl", "peer"):
        mine = sorted(finished(runs, row, system), key=lambda r: r["seed"])
        finals = [float(r["final_eval"]) for r in mine]
        entry: dict[str, Any] = {"seeds": [r["seed"] for r in mine], "finals": finals}
        if finals:
            entry["iqm"], entry["low"], entry["high"] = iqm_interval(finals, reps)
            entry["env_steps_per_s"] = float(np.median([r["env_steps_per_s"] for r in mine]))
        out[system] = entry
    ours, peer = out["daskrl"], out["peer"]
    if "iqm" in ours and "iqm" in peer:
        out["trails"] = ours["iqm"] < peer["low"]
        # ahead: the two intervals do not overlap, daskrl's above
        out["verdict"] = ("trails" if out["trails"] else
                          "ahead" if ours["low"] > peer["high"] else "holds")
    return out


def table(rows: list[dict[str, Any]]) -> str:
    """The markdown table of :func:`summarise`'s rows."""
    def cell(entry: dict[str, Any]) -> str:
        if "iqm" not in entry:
            return "-"
        return f"{entry['iqm']:.1f} [{entry['low']:.1f}, {entry['high']:.1f}]"

    def speed(entry: dict[str, Any]) -> str:
        return f"{entry['env_steps_per_s']:,.0f}" if "env_steps_per_s" in entry else "-"

    body = [[r["algo"], r["env"], f"{r['steps']:,}",
             f"{len(r['daskrl']['finals'])} / {len(r['peer']['finals'])}",
             cell(r["daskrl"]), r["peer_name"], cell(r["peer"]),
             {"trails": "**trails**"}.get(r.get("verdict", "-"), r.get("verdict", "-")),
             speed(r["daskrl"]), speed(r["peer"])] for r in rows]
    return markdown_table(["algorithm", "env", "steps", "seeds (daskrl / peer)",
                           "daskrl IQM [95 % CI]",
                           "peer", "peer IQM [95 % CI]", "vs peer", "daskrl env-steps/s",
                           "peer env-steps/s"], body, align="lllrrlrlrr")


def page(summary: list[dict[str, Any]], rows: list[Row], runs: list[dict[str, Any]],
         args: argparse.Namespace, left_out: dict[str, list[dict[str, Any]]] | None = None
         ) -> str:
    """The page's section: the table, each row's settings, the curves and the load
    (``left_out``: the rows not drawn, each with its runs that lack a recorded curve)."""
    loads = [r["load_before"]["load_1m"] for r in runs
             if (r.get("load_before") or {}).get("load_1m") is not None]
    load = (f"1-minute load at the runs' starts {min(loads):.1f}-{max(loads):.1f} on "
            f"{os.cpu_count()} CPUs, {args.parallel} runs at once" if loads else "")
    curves = args.json.with_name(f"{args.json.stem}_curves.png")
    where = curves.relative_to(args.md.parent) if curves.is_relative_to(args.md.parent) else curves
    lines = [table(summary), "", "A row with fewer seeds than the others has runs still to add "
             "(`python benchmarks/learning.py --rows ROW --seeds ...` runs only what the JSON "
             f"lacks){'; ' + load if load else ''}. Speed columns are medians over the seeds of "
             "runs that shared the cores, so compare them within a row only.", ""]
    lines += [f"- **{r.algo} {r.env}** ({s['steps']:,} steps): {r.note}."
              for r, s in zip(rows, summary, strict=True)]
    left_out = left_out or {}
    if curves.exists():  # plot() removes the picture when it draws no row
        lines += ["", f"![training return, IQM over seeds with 95 % bands]({where.as_posix()})"]
    if left_out:
        rows_said = "1 row" if len(left_out) == 1 else f"{len(left_out)} rows"
        lines += ["", f"Not in the picture: {rows_said} whose runs in the table include some "
                  "without a recorded training curve (recorded before the JSON kept curves, "
                  "or runs that logged fewer than two returns). Each re-run below runs those "
                  "seeds of both systems again; a run whose folder is still in `--work` is "
                  "read from it, not run, so move such a folder away first:", ""]
        for name, lacking in left_out.items():
            seeds = " ".join(str(seed) for seed in sorted({r["seed"] for r in lacking}))
            by_system: dict[str, list[int]] = {}
            for r in lacking:
                by_system.setdefault(r["system"], []).append(r["seed"])
            runs_said = "; ".join(f"{system} seed{'s' if len(got) > 1 else ''} "
                                  + " ".join(map(str, sorted(got)))
                                  for system, got in by_system.items())
            lines.append(f"- {name} ({runs_said}): `python benchmarks/learning.py --fresh "
                         f"--rows {name} --seeds {seeds}`")
    return "\n".join(lines)


def fill_curves(runs: list[dict[str, Any]]) -> None:
    """Give each run recorded without a training curve the curve of its folder, where the
    folder is still there (runs recorded before the JSON kept curves)."""
    for r in runs:
        if r.get("final_eval") is not None and not r.get("curve") and Path(r["dir"]).is_dir():
            r["curve"] = run_curve(Path(r["dir"]))


def common_grid(curves: list[list[list[float]]]) -> tuple[np.ndarray, np.ndarray] | None:
    """Recorded curves (``[steps, returns]`` each) on one grid of env steps, up to the
    shortest run's last step: ``(steps, returns[run, point])``; None without a curve.

    >>> common_grid([[[0.0, 10.0], [0.0, 1.0]], [[0.0, 5.0, 15.0], [2.0, 2.0, 4.0]]])[1][:, -1]
    array([1., 3.])
    """
    if not curves:
        return None
    end = min(c[0][-1] for c in curves)
    start = max(c[0][0] for c in curves)
    grid = np.linspace(start, end, CURVE_POINTS) if end > start else np.asarray([end])
    return grid, np.stack([np.interp(grid, c[0], c[1]) for c in curves])


def finished(runs: list[dict[str, Any]], row: Row, system: str) -> list[dict[str, Any]]:
    """The runs that score ``row``'s ``system`` (a row sharing another's peer reads that
    row's peer runs)."""
    name = source_row(row, system).name
    return [r for r in runs if r["row"] == name and r["system"] == system
            and r.get("final_eval") is not None]


def plot(rows: list[Row], runs: list[dict[str, Any]], path: Path
         ) -> dict[str, list[dict[str, Any]]]:
    """Training-return curves (IQM over the seeds that finished, 95 % bootstrap bands), one
    panel per row, from the curves the runs recorded. A row with a run that has no curve
    (recorded before the JSON kept curves, its folder gone) is left out, so that each panel
    shows the seeds its row of the table scores; returns those rows, each with its runs
    that lack a curve. A row with no finished run has no panel. With no row left, no picture
    (an earlier one is removed)."""
    left_out: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        lacking = [r for system in ("daskrl", "peer") for r in finished(runs, row, system)
                   if not r.get("curve")]
        if lacking:
            left_out[row.name] = lacking
    # a row with no finished run yet (a new row) has nothing to draw either
    rows = [row for row in rows if row.name not in left_out
            and any(finished(runs, row, system) for system in ("daskrl", "peer"))]
    if not rows:
        path.unlink(missing_ok=True)  # an earlier call's picture would not match the table
        return left_out
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = min(4, len(rows))
    fig, axes = plt.subplots(math.ceil(len(rows) / cols), cols, squeeze=False,
                             figsize=(4 * cols, 3 * math.ceil(len(rows) / cols)))
    for ax, row in zip(axes.flat, rows, strict=False):
        for system, label in (("daskrl", "daskrl"), ("peer", row.peer)):
            curve = common_grid([r["curve"] for r in finished(runs, row, system)])
            if curve is None:
                continue
            iqm, low, high = iqm_band(curve[1])
            ax.plot(curve[0], iqm, label=f"{label} ({len(curve[1])})")
            ax.fill_between(curve[0], low, high, alpha=0.25)
        ax.set_title(f"{row.algo} {row.env}", fontsize=9)
        ax.set_xlabel("env steps", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(rows):]:
        ax.set_visible(False)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return left_out


def main(argv: list[str] | None = None) -> None:
    """Parse the flags, run what is missing, write the JSON, the table and the curves."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", nargs="+", choices=list(ROWS), default=list(ROWS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    parser.add_argument("--work", type=Path, default=ROOT / "runs" / "learning",
                        help="folder of the runs (a run already there is read, not re-run)")
    parser.add_argument("--parallel", type=int, default=2, help="runs at once")
    parser.add_argument("--no-run", action="store_true",
                        help="run nothing: report the runs --json records and those in --work")
    parser.add_argument("--quick", action="store_true",
                        help="a smoke test: PPO and DQN on CartPole, a few thousand steps, "
                             "seeds 1-2, into a temporary folder; writes nothing here")
    parser.add_argument("--json", type=Path, default=HERE / "results" / "learning.json")
    parser.add_argument("--md", type=Path, default=HERE / "learning.md")
    parser.add_argument("--section", default="learning", help="section of --md to rewrite")
    parser.add_argument("--fresh", action="store_true",
                        help="forget what --json records of the rows and seeds asked: their "
                             "jobs run again unless a folder in --work holds them; other rows' "
                             "and seeds' records are kept")
    args = parser.parse_args(argv)
    steps = {name: row.steps for name, row in ROWS.items()}
    if args.quick:
        tmp = Path(tempfile.mkdtemp(prefix="daskrl-learning-"))
        args.rows, args.seeds, args.work = list(QUICK_STEPS), [1, 2], tmp / "runs"
        args.json, args.md, steps = tmp / "learning.json", tmp / "learning.md", QUICK_STEPS
    rows = [ROWS[name] for name in args.rows]

    def shared(row: Row, system: str) -> str:
        return source_row(row, system).name

    asked = {(shared(row, system), system) for row in rows for system in ("daskrl", "peer")}

    def remembered(path: Path) -> dict[tuple[str, str, int, int | None], dict[str, Any]]:
        return {k: r for k, r in recorded(path).items()
                if not (args.fresh and (k[0], k[1]) in asked and k[2] in args.seeds)}

    kept = remembered(args.json)
    for key in kept:
        if key[0] not in steps:
            print(f"{args.json}: {key[0]} {key[1]} s{key[2]}: not a row of the suite: kept in "
                  "the JSON, not scored", file=sys.stderr)
        elif key[3] != steps[key[0]]:
            print(f"{args.json}: {key[0]} {key[1]} s{key[2]} ran {key[3]:,} steps, not the "
                  f"row's {steps[key[0]]:,}: kept in the JSON, not scored", file=sys.stderr)
    # seed by seed: a suite cut short has every row's first seeds, not some rows' all
    jobs = [(row, system, seed) for seed in args.seeds for row in rows
            for system in ("daskrl", "peer") if not (system == "peer" and row.peer_row
                                                     and row.peer_row in args.rows)
            and (shared(row, system), system, seed, steps[shared(row, system)]) not in kept]
    loads = [load_average()]
    def one(job: tuple[Row, str, int]) -> dict[str, Any]:
        row, system, seed = job
        return run_one(row, system, seed, steps[shared(row, system)], args.work,
                       not args.no_run)

    new = run_all(jobs, one, args.parallel, lambda job, result: (
        f"{job[0].name} {job[1]} s{job[2]}: {result.get('final_eval')}"))
    loads.append(load_average())
    errors = [r for r in new if r.get("error")]
    for r in errors:
        print(f"{r['row']} {r['system']} seed {r['seed']} failed: {r['error'][-500:]}",
              file=sys.stderr)
    # read the JSON again: another call may have recorded runs while this one ran
    merged = kept | remembered(args.json) | {
        (r["row"], r["system"], r["seed"], r["steps"]): r for r in new
        if r.get("final_eval") is not None}
    order = [*ROWS, *sorted({k[0] for k in merged} - set(ROWS))]
    runs = sorted([*merged.values(), *errors],
                  key=lambda r: (order.index(r["row"]), r["system"], r["seed"]))
    fill_curves(runs)
    # the report covers every row with runs at its budget, the kept ones included
    scored = [r for r in runs if r.get("final_eval") is not None and r["row"] in steps
              and r.get("steps") == steps[r["row"]]]
    rows = [row for row in ROWS.values() if row.name in args.rows
            or any(r["row"] == row.name for r in scored)]
    summary = [summarise(row, scored, steps[row.name]) for row in rows]
    write_json(args.json, {"machine": machine_info(), "loads": loads, "args": vars(args),
                           "rows": summary, "runs": runs})
    left_out = plot(rows, scored, args.json.with_name(f"{args.json.stem}_curves.png"))
    if left_out:
        print(f"rows not in the curves' picture, some runs recorded without a curve: "
              f"{', '.join(left_out)} (--fresh --rows ROW runs them again)", file=sys.stderr)
    update_section(args.md, args.section, page(summary, rows, scored, args, left_out))
    print(table(summary))
    if errors:
        raise SystemExit(f"{len(errors)} run(s) failed")


if __name__ == "__main__":
    main()
