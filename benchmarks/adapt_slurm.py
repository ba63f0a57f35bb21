"""``--adapt MIN:MAX`` on a real Slurm pool against fixed pools: time to a return and the
worker-seconds each used.

Each run is ``daskrl train graphs/ppo.py --cluster slurm`` (one core a job) on PPO with two
actors whose env steps cost CPU (``--env-step-cost``), so one worker steps both actors in
turn and two step them at once: with ``--cpu-jobs MIN`` and with ``--cpu-jobs MAX`` fixed,
and with ``--adapt MIN:MAX`` (it starts with MIN jobs and asks Slurm for more while the
learner waits). Reported per setting, medians over interleaved repeats: the run's wall clock
to the first iteration whose training return reaches ``--target`` (``metrics.csv``'s
``wall_s``, from the run's start: job start-up excluded), the whole command's wall clock
(job start-up included), and worker-seconds (fixed: jobs x the run's wall clock; adaptive:
what ``summary.json``'s ``adapt`` integrated while the run went on).

With ``--preempt``: ``--adapt MIN:MAX`` runs only, and once the run has placed a replica on
the job it asked for, that job is cancelled (``scancel``, as a pre-emption would end it):
reported per run, the iterations recorded (each once?), the seconds between the last
iteration before the loss and the first after it against the median iteration before, and
whether the run asked for a job again.

Needs the single-node Slurm of ``.ci/slurm-up.sh`` (run it as root first); on this 2-core
machine a node holds two one-core jobs, so ``--adapt 1:2`` is what fits.

    python benchmarks/adapt_slurm.py --repeats 3
    python benchmarks/adapt_slurm.py --preempt --repeats 3
    python benchmarks/adapt_slurm.py --quick      # one repeat, a short run
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _common import (
    ROOT,
    load_average,
    machine_info,
    markdown_table,
    median,
    update_section,
    write_json,
)

HERE = Path(__file__).resolve().parent


def command(setting: str, low: int, high: int, steps: int, cost: float, out: Path
            ) -> list[str]:
    """The ``daskrl train`` line of one run."""
    pool = {"fixed-min": ["--cpu-jobs", str(low)], "fixed-max": ["--cpu-jobs", str(high)],
            "adapt": ["--adapt", f"{low}:{high}"]}[setting]
    return [sys.executable, "-m", "daskrl", "train", "graphs/ppo.py", "--cluster", "slurm",
            "--cores", "1", "--memory", "2GB", *pool, "--num-actors", str(high),
            "--env-step-cost", str(cost), "--steps", str(steps), "--no-eval", "--no-progress",
            "--out", str(out)]


def run_one(setting: str, rep: int, args: argparse.Namespace) -> dict[str, Any]:
    """Run one setting once and read what it did."""
    out = args.work / f"{setting}-{rep}"
    if out.exists():
        shutil.rmtree(out)
    cmd = command(setting, args.min, args.max, args.steps, args.env_step_cost, out)
    load = load_average()
    started = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    wall = time.perf_counter() - started
    if done.returncode:
        return {"setting": setting, "repeat": rep, "error": done.stderr[-2000:], "load": load}
    summary = json.loads((out / "summary.json").read_text())
    reached = time_to(out, args.target)
    jobs = {"fixed-min": args.min, "fixed-max": args.max}.get(setting)
    worker_s = (jobs * summary["wall_s"] if jobs is not None
                else summary["adapt"]["worker_s"])
    return {"setting": setting, "repeat": rep, "command": cmd, "command_wall_s": wall,
            "run_wall_s": summary["wall_s"], "time_to_target_s": reached,
            "worker_s": worker_s, "env_steps_per_s": summary["env_steps_per_s"],
            "adapt": summary.get("adapt"), "replans": summary.get("replans"), "load": load}


def _jobs() -> list[int]:
    """This user's Slurm job ids, oldest first."""
    listed = subprocess.run(["squeue", "--me", "-h", "-o", "%i"], capture_output=True,
                            text=True).stdout.split()
    return sorted(int(j) for j in listed if j.isdigit())


def preempt_one(rep: int, args: argparse.Namespace) -> dict[str, Any]:
    """An ``--adapt`` run whose added job is cancelled once the run uses it."""
    from daskrl.observe.metrics import iteration_rows

    out = args.work / f"preempt-{rep}"
    if out.exists():
        shutil.rmtree(out)
    cmd = command("adapt", args.min, args.max, args.steps, args.env_step_cost, out)
    load = load_average()
    before = set(_jobs())
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=ROOT)
    cancelled, at = None, None
    deadline = time.monotonic() + 600
    while proc.poll() is None and time.monotonic() < deadline:
        rows = iteration_rows(out)
        if any("joined" in (r.get("replan") or "") for r in rows) and len(rows) >= 3:
            mine = [j for j in _jobs() if j not in before]
            if len(mine) >= 2:  # the run's first job, and the one it asked for
                cancelled, at = mine[-1], len(rows)
                subprocess.run(["scancel", str(cancelled)], check=True)
                break
        time.sleep(0.2)
    _, err = proc.communicate(timeout=900)
    if proc.returncode or cancelled is None:
        return {"repeat": rep, "error": err[-2000:], "cancelled": cancelled, "load": load}
    summary = json.loads((out / "summary.json").read_text())
    rows = iteration_rows(out)
    times = [float(r["iteration_s"]) for r in rows]
    steady = times[max(0, at - 6):at - 1]
    gap = max(times[at:at + 3]) if len(times) > at else None
    lost = [line for line in err.splitlines() if " lost (" in line]
    return {"repeat": rep, "command": cmd, "cancelled_job": cancelled,
            "cancelled_after_iteration": at, "iterations": [int(r["iteration"]) for r in rows],
            "each_once": [int(r["iteration"]) for r in rows] == list(range(1, len(rows) + 1)),
            "iteration_s_before": median(steady), "longest_iteration_s_after": gap,
            "recoveries": lost, "adapt": summary.get("adapt"),
            "joined_at": [int(r["iteration"]) for r in rows if "joined" in (r.get("replan") or "")],
            "placement": summary.get("placement"), "run_wall_s": summary["wall_s"],
            "load": load}


def preempt_table(runs: list[dict[str, Any]]) -> str:
    """One row per pre-empted run."""
    body = []
    for r in runs:
        if "error" in r:
            body.append([r["repeat"], "error", "", "", "", "", ""])
            continue
        body.append([r["repeat"], r["cancelled_after_iteration"],
                     "yes" if r["each_once"] else "no", r["iteration_s_before"],
                     r["longest_iteration_s_after"], len(r["recoveries"]),
                     ", ".join(map(str, r["joined_at"]))])
    return markdown_table(["run", "job cancelled after iteration", "each iteration once",
                           "iteration s before (1 job)", "longest of the 3 after",
                           "recoveries", "a job joined (used from iteration)"], body,
                          align="rrrrrrl")


def time_to(out: Path, target: float) -> float | None:
    """The run's own wall clock at its first iteration whose training return reaches
    ``target`` (None: it never did)."""
    from daskrl.observe.metrics import iteration_rows

    return next((float(r["wall_s"]) for r in iteration_rows(out)
                 if r.get("episode_return_mean")
                 and float(r["episode_return_mean"]) >= target), None)


def table(runs: list[dict[str, Any]], args: argparse.Namespace) -> str:
    """Medians per setting."""
    labels = {"fixed-min": f"{args.min} job(s), fixed", "fixed-max": f"{args.max} jobs, fixed",
              "adapt": f"--adapt {args.min}:{args.max}"}
    body = []
    for setting, label in labels.items():
        mine = [r for r in runs if r["setting"] == setting and "error" not in r]
        if not mine:
            continue
        body.append([label, median([r["time_to_target_s"] for r in mine]),
                     sum(r["time_to_target_s"] is not None for r in mine),
                     median([r["run_wall_s"] for r in mine]),
                     median([r["command_wall_s"] for r in mine]),
                     median([r["worker_s"] for r in mine]),
                     median([r["env_steps_per_s"] for r in mine]), len(mine)])
    return markdown_table(["pool", f"s to return {args.target:g}", "reached",
                           "run wall s", "command wall s", "worker-seconds", "env-steps/s",
                           "runs"], body, align="lrrrrrrr")


def main(argv: list[str] | None = None) -> None:
    """Parse the flags, run the settings interleaved, write the JSON and the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--min", type=int, default=1)
    parser.add_argument("--max", type=int, default=2)
    parser.add_argument("--steps", type=int, default=60_000)
    parser.add_argument("--env-step-cost", type=float, default=0.001)
    parser.add_argument("--target", type=float, default=50.0,
                        help="training return the time is taken to")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--preempt", action="store_true",
                        help="cancel the job --adapt added once the run uses it")
    parser.add_argument("--tables-only", action="store_true",
                        help="re-read the runs of --json and their folders under --work "
                             "(e.g. for another --target), running nothing")
    parser.add_argument("--work", type=Path, default=ROOT / "runs" / "adapt-slurm")
    parser.add_argument("--json", type=Path, default=HERE / "results" / "adapt_slurm.json")
    parser.add_argument("--md", type=Path, default=HERE / "adapt_slurm.md")
    parser.add_argument("--section", default="adapt-slurm")
    args = parser.parse_args(argv)
    if args.tables_only:
        runs = json.loads(args.json.read_text())["runs"]
        for r in runs:
            if "error" not in r:
                r["time_to_target_s"] = time_to(args.work / f"{r['setting']}-{r['repeat']}",
                                                args.target)
        write_report(runs, args)
        return
    if shutil.which("sinfo") is None or subprocess.run(["sinfo"], capture_output=True
                                                       ).returncode:
        sys.exit("Slurm is not up: run `bash .ci/slurm-up.sh` as root first")
    if args.quick:
        args.repeats, args.steps = 1, 8_192
        args.json = args.json.with_name("adapt_slurm_quick.json")
        args.md = args.md.with_name("_adapt_slurm_quick.md")
    if args.preempt:
        runs = [preempt_one(rep, args) for rep in range(args.repeats)]
        write_json(args.json.with_name("adapt_slurm_preempt.json"),
                   {"machine": machine_info(), "runs": runs})
        loads = [r["load"]["load_1m"] for r in runs]
        text = (preempt_table(runs) + f"\n\n{runs[0]['load']['time']} to "
                f"{runs[-1]['load']['time']}, 1-minute load {min(loads):.1f}-{max(loads):.1f} "
                "before the runs.")
        if not args.quick:
            update_section(args.md, "adapt-slurm-preempt", text)
        print(text)
        return
    runs = []
    settings = ["fixed-min", "fixed-max", "adapt"]
    for rep in range(args.repeats):
        for setting in settings[rep % 3:] + settings[:rep % 3]:
            runs.append(run_one(setting, rep, args))
            print(json.dumps({k: runs[-1].get(k) for k in (
                "setting", "time_to_target_s", "run_wall_s", "worker_s", "error")}),
                flush=True)
    write_report(runs, args)


def write_report(runs: list[dict[str, Any]], args: argparse.Namespace) -> None:
    """The JSON and the table."""
    write_json(args.json, {"machine": machine_info(), "args": {k: str(v) for k, v in
                                                               vars(args).items()},
                           "runs": runs})
    text = table(runs, args)
    loads = [r["load"]["load_1m"] for r in runs]
    text += (f"\n\n{runs[0]['load']['time']} to {runs[-1]['load']['time']}, 1-minute load "
             f"{min(loads):.1f}-{max(loads):.1f} before the runs.")
    update_section(args.md, args.section, text)
    print(text)


if __name__ == "__main__":
    main()
