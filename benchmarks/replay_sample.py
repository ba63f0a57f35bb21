"""Replay sampling speed and memory: 256 transitions from 1M prioritised (and uniform) entries.

Measures the time of one ``sample(256)`` call and of one ``update_priorities`` of 256 new
priorities, medians over repeats, and the bytes a buffer of 1M CartPole transitions holds.

    python benchmarks/replay_sample.py                 # full: results/replay_sample.json
    python benchmarks/replay_sample.py --quick         # 100k entries, a few calls
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np
from _common import ROOT, fmt, load_average, machine_info, markdown_table, median, write_json

from daskrl.algos.replay_buffers import PrioritizedReplay, ReplayBuffer


def _fill(buf: ReplayBuffer, entries: int, rng: np.random.Generator) -> None:
    chunk = 100_000
    for lo in range(0, entries, chunk):
        n = min(chunk, entries - lo)
        batch = {"obs": rng.normal(size=(n, 4)).astype(np.float32),
                 "actions": rng.integers(0, 2, n), "rewards": np.ones(n, np.float32),
                 "next_obs": rng.normal(size=(n, 4)).astype(np.float32),
                 "discounts": np.full(n, 0.99, np.float32)}
        buf.add(batch, rng.gamma(0.5, 1.0, n) if buf.prioritized else None)


def _time_calls(fn, calls: int) -> list[float]:
    out = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", type=Path, default=ROOT / "benchmarks/results/replay_sample.json")
    args = parser.parse_args()
    if args.quick:
        args.entries, args.calls, args.repeats = 100_000, 200, 1
    load_before = load_average()
    rng = np.random.default_rng(0)
    rows, results = [], {}
    for name, buf in (("prioritized", PrioritizedReplay(args.entries, alpha=0.6, seed=0)),
                      ("uniform", ReplayBuffer(args.entries, seed=0))):
        _fill(buf, args.entries, rng)
        sample_ms, update_ms = [], []
        for _ in range(args.repeats):
            sample_ms.append(1e3 * median(_time_calls(lambda b=buf: b.sample(args.batch),
                                                      args.calls)))
            idx = rng.integers(0, args.entries, args.batch)
            pri = rng.random(args.batch)
            update_ms.append(1e3 * median(_time_calls(
                lambda b=buf, i=idx, p=pri: b.update_priorities(i, p), args.calls)))
        results[name] = {"entries": args.entries, "batch": args.batch,
                         "sample_ms": sample_ms, "update_ms": update_ms,
                         "sample_ms_median": median(sample_ms),
                         "update_ms_median": median(update_ms), "nbytes": buf.nbytes,
                         "mib": buf.nbytes / 2**20}
        rows.append([name, args.entries, args.batch, fmt(median(sample_ms)),
                     fmt(median(update_ms)), fmt(buf.nbytes / 2**20)])
    load = {"before": load_before, "after": load_average(), "cpus": os.cpu_count()}
    table = markdown_table(["buffer", "entries", "batch", "sample ms (median)",
                            "update ms (median)", "MiB (CartPole)"], rows)
    print(table)
    print(f"load average before/after: {load_before} / {load['after']}")
    if not args.quick:
        write_json(args.json, {"results": results, "load": load, "machine": machine_info(),
                               "settings": vars(args) | {"json": str(args.json)}})


if __name__ == "__main__":
    main()
