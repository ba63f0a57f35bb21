"""Soak and churn: a long PPO run with 2 actors while a worker is killed every minute.

``daskrl train graphs/ppo.py --workers 2 --num-actors 2`` runs for ``--minutes`` (30 by
default); every ``--kill-every`` seconds one of its worker processes is killed with SIGKILL
(the nanny starts it again, the run recovers). RSS of the driver and of every worker process
is sampled every ``--sample-every`` seconds. At the end the driver gets SIGTERM (it stops
like Ctrl-C, with a checkpoint) and the script checks:

- every iteration in ``metrics.csv`` exactly once, in order, with the env-step counter
  counting each once;
- RSS growth after warm-up (the median of the first fifth of the samples after
  ``--warmup`` seconds against the median of the last fifth) for the driver and the
  workers (workers restart when killed, so theirs is taken per process lifetime: the
  longest-lived worker process);
- no process of the run left (workers, the fork server) a few seconds after the driver.

Writes ``benchmarks/results/soak.json`` (samples included) and a table in
``benchmarks/soak.md``. Not run in CI: ``python benchmarks/soak.py --minutes 3`` for a short
version.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
from _common import ROOT, load_average, machine_info, markdown_table, update_section, write_json

RESULTS = ROOT / "benchmarks" / "results" / "soak.json"
REPORT = ROOT / "benchmarks" / "soak.md"


def _workers(driver: psutil.Process) -> list[psutil.Process]:
    """The embedded cluster's worker processes: spawned, or forked by daskrl's fork server."""
    try:
        descendants = driver.children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    servers = set()
    found = []
    for child in descendants:
        try:
            line = " ".join(child.cmdline())
            if child.ppid() == driver.pid and "forkserver" in line:
                servers.add(child.pid)
        except psutil.NoSuchProcess:
            continue
    for child in descendants:
        try:
            if "spawn_main" in " ".join(child.cmdline()) or child.ppid() in servers:
                found.append(child)
        except psutil.NoSuchProcess:
            continue
    return found


def _rss(proc: psutil.Process) -> int | None:
    try:
        return proc.memory_info().rss
    except psutil.NoSuchProcess:
        return None


def _rows(path: Path) -> list[dict[str, str]]:
    if not path.exists():
        return []
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


def _growth(samples: list[tuple[float, int]], warmup: float) -> dict[str, Any]:
    """RSS growth after ``warmup`` seconds of the process's working life: median of the last
    fifth of the samples over the first fifth.

    A worker's working life starts when its RSS first doubles (it got its first task and
    imported torch): a replacement worker can sit idle until the next placement uses it.
    """
    if not samples:
        return {"samples": 0, "growth": None}
    born = next((t for t, rss in samples if rss >= 2 * samples[0][1]), samples[0][0])
    kept = [rss for t, rss in samples if t - born >= warmup]
    if len(kept) < 10:
        return {"samples": len(kept), "growth": None}
    fifth = max(2, len(kept) // 5)
    first, last = statistics.median(kept[:fifth]), statistics.median(kept[-fifth:])
    return {"samples": len(kept), "first_mib": first / 2**20, "last_mib": last / 2**20,
            "growth": last / first - 1}


def _worker_growth(worker_rss: dict[Any, list[tuple[float, int]]], warmup: float
                   ) -> dict[str, Any]:
    """:func:`_growth` of the worker process with the most samples after its warm-up (a
    killed one starts anew)."""
    grown = [_growth(samples, warmup) for samples in worker_rss.values()]
    return max(grown, key=lambda g: g["samples"], default={"samples": 0, "growth": None})


def check_metrics(out: Path) -> dict[str, Any]:
    """Every iteration once and in order; env steps counted once per iteration."""
    rows = [r for r in _rows(out / "metrics.csv") if r.get("iteration")]
    iterations = [int(r["iteration"]) for r in rows]
    own = [int(r["iteration_env_steps"]) for r in rows]
    total = [int(r["env_steps"]) for r in rows]
    cumulative = [sum(own[: i + 1]) for i in range(len(own))]
    return {"iterations": len(rows),
            "contiguous": iterations == list(range(1, len(rows) + 1)),
            "env_steps_counted_once": total == cumulative}


def soak(minutes: float, kill_every: float, sample_every: float, warmup: float, out: Path
         ) -> dict[str, Any]:
    """Run, churn, sample; the results (see the module docstring)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    log = out.parent / f"{out.name}.log"
    args = [sys.executable, "-m", "daskrl.cli", "train", "graphs/ppo.py", "--workers", "2",
            "--num-actors", "2", "--num-envs", "4", "--num-steps", "128", "--steps",
            str(10**9), "--out", str(out), "--no-progress", "--no-eval"]
    load_before = load_average()
    proc = subprocess.Popen(args, cwd=ROOT, stdout=log.open("w"), stderr=subprocess.STDOUT,
                            start_new_session=True)
    driver = psutil.Process(proc.pid)
    t0 = time.monotonic()
    deadline = t0 + 60 * minutes
    next_kill = t0 + kill_every
    driver_rss: list[tuple[float, int]] = []
    worker_rss: dict[int, list[tuple[float, int]]] = {}
    kills: list[dict[str, Any]] = []
    seen: set[int] = set()
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            now = time.monotonic() - t0
            if (rss := _rss(driver)) is not None:
                driver_rss.append((now, rss))
            workers = _workers(driver)
            for w in workers:
                seen.add(w.pid)
                if (rss := _rss(w)) is not None:
                    worker_rss.setdefault(w.pid, []).append((now, rss))
            if time.monotonic() >= next_kill and workers:
                victim = workers[len(kills) % len(workers)]
                rows = len(_rows(out / "metrics.csv"))
                try:
                    os.kill(victim.pid, signal.SIGKILL)
                    kills.append({"t_s": now, "pid": victim.pid, "rows_before": rows})
                except ProcessLookupError:
                    pass
                next_kill += kill_every
            time.sleep(sample_every)
        ended_early = proc.poll() is not None
        if not ended_early:
            proc.send_signal(signal.SIGTERM)  # stops like Ctrl-C: checkpoint, workers closed
        code = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    time.sleep(5)
    left = [pid for pid in seen if psutil.pid_exists(pid)
            and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
    text = log.read_text()
    return {
        "minutes": minutes, "kill_every_s": kill_every, "sample_every_s": sample_every,
        "warmup_s": warmup, "exit_code": code, "ended_early": ended_early,
        "kills": kills, "recoveries_logged": text.count("lost ("),
        "metrics": check_metrics(out),
        "driver_rss": _growth(driver_rss, warmup),
        "worker_rss_longest_lived": _worker_growth(worker_rss, warmup),
        "leaked_processes": left,
        "samples": {"driver": driver_rss, "workers": {str(k): v for k, v in worker_rss.items()}},
        "load_before": load_before, "load_after": load_average(),
        "machine": machine_info(),
    }


def _report(result: dict[str, Any]) -> str:
    metrics, d, w = result["metrics"], result["driver_rss"], result["worker_rss_longest_lived"]
    table = markdown_table(
        ["minutes", "kills", "recoveries", "iterations", "contiguous", "driver RSS growth",
         "worker RSS growth", "leaked processes", "load 1m"],
        [[result["minutes"], len(result["kills"]), result["recoveries_logged"],
          metrics["iterations"], metrics["contiguous"] and metrics["env_steps_counted_once"],
          d.get("growth"), w.get("growth"), len(result["leaked_processes"]),
          result["load_after"]["load_1m"]]])
    return (f"Soak and churn (`python benchmarks/soak.py --minutes {result['minutes']:g}`): "
            f"PPO, 2 actors, a worker killed every {result['kill_every_s']:g} s; RSS growth is "
            f"the median of the last fifth of the samples after {result['warmup_s']:g} s over "
            f"the first fifth (worker: the process with the most samples, its warm-up counted "
            f"from its first task). Load average before/after: "
            f"{result['load_before']['load_1m']:.1f}/{result['load_after']['load_1m']:.1f}."
            f"\n\n{table}\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--kill-every", type=float, default=60.0)
    parser.add_argument("--sample-every", type=float, default=2.0)
    parser.add_argument("--warmup", type=float, default=60.0)
    parser.add_argument("--out", type=Path, default=Path("/tmp/daskrl-soak/run"))
    parser.add_argument("--report-only", action="store_true",
                        help="recompute the growth and the table from the saved JSON")
    args = parser.parse_args()
    if args.report_only:
        result = json.loads(RESULTS.read_text())
        result["driver_rss"] = _growth(result["samples"]["driver"], result["warmup_s"])
        result["worker_rss_longest_lived"] = _worker_growth(result["samples"]["workers"],
                                                            result["warmup_s"])
        write_json(RESULTS, result)
        update_section(REPORT, "soak", _report(result))
        return
    if args.out.exists():
        raise SystemExit(f"{args.out} exists: pass another --out")
    result = soak(args.minutes, args.kill_every, args.sample_every, args.warmup, args.out)
    write_json(RESULTS, result)
    update_section(REPORT, "soak", _report(result))
    summary = {k: result[k] for k in ("exit_code", "recoveries_logged", "metrics", "driver_rss",
                                      "worker_rss_longest_lived", "leaked_processes")}
    print(summary)


if __name__ == "__main__":
    main()
