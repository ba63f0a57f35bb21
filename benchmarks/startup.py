"""Time from launch to the first metrics row of ``daskrl train``, for one or more source trees.

Runs ``python -m daskrl.cli train SRC/graphs/ppo.py --steps 4096 --no-eval --no-progress``
with ``PYTHONPATH=SRC`` for each tree in turn (interleaved, so that a change in the machine's
load hits every tree alike), watches ``metrics.csv`` and prints one JSON line per run: the
seconds from launch to the first row, to exit, the CPU seconds of the run's processes, and
the 1-minute load average at launch. The summary line gives the medians per tree.

    git worktree add /tmp/before <commit>
    python benchmarks/startup.py --repeats 5 before=/tmp/before after=.

A first run per tree byte-compiles it and is left out (``--warmup``).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def run_once(src: Path, out: Path, steps: int) -> dict[str, float | None]:
    """One launch of ``daskrl train`` from ``src``; the timings of that run."""
    shutil.rmtree(out, ignore_errors=True)
    load = float(Path("/proc/loadavg").read_text().split()[0])
    env = {**os.environ, "PYTHONPATH": str(src)}
    cmd = [sys.executable, "-m", "daskrl.cli", "train", str(src / "graphs" / "ppo.py"),
           "--steps", str(steps), "--out", str(out), "--no-progress", "--no-eval"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.time()
    with open(f"{out}.log", "w") as log:
        proc = subprocess.Popen(cmd, env=env, cwd=src, stdout=subprocess.DEVNULL, stderr=log)
        first = None
        while proc.poll() is None:
            if first is None and _rows(out / "metrics.csv") >= 1:
                first = time.time() - t0
            time.sleep(0.005)
    total = time.time() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited with {proc.returncode}: see {out}.log")
    return {"first_row_s": first, "exit_s": total, "cpu_s": cpu, "load_1m": load}


def _rows(path: Path) -> int:
    try:
        return max(0, path.read_text().count("\n") - 1)
    except OSError:
        return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trees", nargs="+", metavar="NAME=SRC", help="source trees to time")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=4096)
    parser.add_argument("--warmup", type=int, default=1)
    args = parser.parse_args(argv)
    trees = dict(t.split("=", 1) for t in args.trees)
    results: dict[str, list[dict]] = {name: [] for name in trees}
    work = Path(tempfile.mkdtemp(prefix="daskrl-startup-"))
    for i in range(args.warmup + args.repeats):
        for name, src in trees.items():
            row = run_once(Path(src).resolve(), work / f"{name}-{i}", args.steps)
            if i >= args.warmup:
                results[name].append(row)
                print(json.dumps({"tree": name, **row}), flush=True)
    summary = {name: {key: statistics.median(r[key] for r in rows if r[key] is not None)
                      for key in ("first_row_s", "exit_s", "cpu_s", "load_1m")}
               for name, rows in results.items()}
    print(json.dumps({"medians": summary, "repeats": args.repeats}), flush=True)
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
