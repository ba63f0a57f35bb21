"""Does a replay learner's gradient step cost more as its replay fills? DQN (uniform and
prioritised) and SAC, each with its graph's defaults, timed per gradient step with the
replay holding a few thousand transitions and holding its whole capacity.

Each learner is built as its graph builds it (``graphs/dqn.py``: buffer 100k, batch 64,
256x256; ``graphs/sac.py``: buffer 1M, batch 256, 256x256), its replay filled with random
transitions of the env's shapes (CartPole-v1, Pendulum-v1), then one iteration's gradient
steps are timed through :meth:`~daskrl.algos.replay_learner.ReplayLearner.train`, the path a
run takes (DQN: one uniform sample for the iteration's steps, or one prioritised sample and
priority update per step; SAC: one sample, then each step). The fills alternate within one
process, repeats times, one torch thread; times are the process's CPU seconds per gradient
step (on a shared machine wall time also counts other processes' turns). A learner that
samples in time linear in its replay's size would show it here as a ratio well above 1.

    python benchmarks/replay_fill.py                 # results/replay_fill.json + the table
    python benchmarks/replay_fill.py --quick         # smoke: small fills, 2 repeats
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from _common import (
    ROOT,
    fmt,
    load_average,
    machine_info,
    markdown_table,
    median,
    ratio,
    update_section,
    write_json,
)

sys.path.insert(0, str(ROOT))  # daskrl from this checkout

HERE = Path(__file__).resolve().parent


def random_transitions(n: int, obs_dim: int, act_shape: tuple[int, ...], discrete: bool,
                       rng: np.random.Generator) -> dict[str, np.ndarray]:
    """``n`` transitions of random values in the shapes a collector writes."""
    actions = (rng.integers(0, 2, n) if discrete
               else rng.uniform(-2, 2, (n, *act_shape)).astype(np.float32))
    return {"obs": rng.normal(size=(n, obs_dim)).astype(np.float32), "actions": actions,
            "rewards": rng.normal(size=n).astype(np.float32),
            "next_obs": rng.normal(size=(n, obs_dim)).astype(np.float32),
            "discounts": np.full(n, 0.99, np.float32)}


def build(name: str) -> tuple[Any, int, tuple[int, ...], bool, int]:
    """A learner as its graph builds it: (learner, obs size, action shape, discrete, capacity)."""
    from daskrl.core.script import load_graph

    if name.startswith("dqn"):
        graph = load_graph(str(ROOT / "graphs" / "dqn.py"))
        config = graph.Config(prioritized_replay=name == "dqn-prioritized")
        return graph.make_learner(config, 4, 2, 0, "cpu"), 4, (), True, config.buffer_size
    graph = load_graph(str(ROOT / "graphs" / "sac.py"))
    config = graph.Config()
    return graph.make_learner(config, 0, "cpu"), 3, (1,), False, config.buffer_size


def fill_to(learner: Any, rows: int, obs_dim: int, act_shape: tuple[int, ...],
            discrete: bool, rng: np.random.Generator) -> None:
    """Add random transitions until the replay holds ``rows`` (in chunks, as rollouts do)."""
    while len(learner.replay) < rows:
        n = min(10_000, rows - len(learner.replay))
        learner.replay.add(random_transitions(n, obs_dim, act_shape, discrete, rng))


def time_steps(learner: Any, steps: int) -> float:
    """CPU seconds per gradient step of one iteration's ``steps`` gradient steps."""
    from daskrl.algos.offpolicy import TensorMeans

    ends = [learner.env_steps + (i + 1) * learner.train_frequency for i in range(steps)]
    learner.env_steps = ends[-1]
    t = time.process_time()
    learner.train(ends, 0.5, TensorMeans())
    return (time.process_time() - t) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--algos", nargs="+", default=["dqn", "dqn-prioritized", "sac"],
                        choices=["dqn", "dqn-prioritized", "sac"])
    parser.add_argument("--small", type=int, default=5_000,
                        help="the small fill (transitions)")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--quick", action="store_true",
                        help="a smoke test: 2 repeats, fills of 1k and 4k; writes nothing here")
    parser.add_argument("--json", type=Path, default=HERE / "results" / "replay_fill.json")
    args = parser.parse_args()
    torch.set_num_threads(1)  # one thread, as a worker's task with one CPU
    rng = np.random.default_rng(0)
    loads, rows, runs = [load_average()], [], []
    for name in args.algos:
        learner_small, obs_dim, act_shape, discrete, capacity = build(name)
        learner_full = build(name)[0]
        full = 4_000 if args.quick else capacity
        small = 1_000 if args.quick else args.small
        fill_to(learner_small, small, obs_dim, act_shape, discrete, rng)
        fill_to(learner_full, full, obs_dim, act_shape, discrete, rng)
        steps = 128 if name.startswith("dqn") else 100  # one default iteration's
        for learner in (learner_small, learner_full):  # warm-up: allocations, first calls
            time_steps(learner, 8)
        per: dict[int, list[float]] = {small: [], full: []}
        for r in range(2 if args.quick else args.repeats):
            order = [(small, learner_small), (full, learner_full)]
            for fill, learner in (order if r % 2 == 0 else order[::-1]):
                per[fill].append(time_steps(learner, steps))
                runs.append({"algo": name, "fill": fill, "repeat": r,
                             "cpu_s_per_step": per[fill][-1]})
        row = {"algo": name, "capacity": capacity, "small_fill": small, "full_fill": full,
               "ms_small": 1e3 * median(per[small]), "ms_full": 1e3 * median(per[full])}
        row["full_over_small"] = ratio(row["ms_full"], row["ms_small"])
        rows.append(row)
        print(f"{name}: {row['ms_small']:.2f} ms/step at {small:,}, {row['ms_full']:.2f} at "
              f"{full:,} ({row['full_over_small']:.2f}x)", flush=True)
        del learner_small, learner_full
    loads.append(load_average())
    body = markdown_table(
        ["learner", "replay capacity", "ms per gradient step, replay at the small fill",
         "ms per gradient step, replay full", "full / small"],
        [[r["algo"], f"{r['capacity']:,}", f"{fmt(r['ms_small'])} ({r['small_fill']:,})",
          f"{fmt(r['ms_full'])} ({r['full_fill']:,})", fmt(r["full_over_small"])]
         for r in rows], align="lrrrr")
    print(body)
    if args.quick:
        return
    write_json(args.json, {"machine": machine_info(), "loads": loads, "args": vars(args),
                           "rows": rows, "runs": runs})
    update_section(HERE / "replay_fill.md", "table", "\n".join([
        body, "", f"`python benchmarks/replay_fill.py --repeats {args.repeats}`: 1-minute load "
        f"{loads[0]['load_1m']:.1f} before, {loads[1]['load_1m']:.1f} after; CPU seconds of "
        "this process, medians over the repeats."]))


if __name__ == "__main__":
    main()
