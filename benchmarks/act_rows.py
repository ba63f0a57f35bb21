"""Numpy or torch for an actor's forward pass, by batch size: where ``NUMPY_MAX_ROWS`` comes
from.

The actor-critics' ``act`` runs a small CPU batch in numpy (``_act_numpy``: no torch dispatch
per op) and a larger one in torch (``_act_torch``: vectorised activations). This times both
paths of the PPO heads (``DiscreteActorCritic`` on CartPole's shapes, ``GaussianActorCritic``
with running normalisation on HalfCheetah's, 64x64 towers) at several batch sizes, numpy's
BLAS on one thread and torch on one and on two, in one process; each cell is the median over
``--repeats`` of the fastest of a few timed loops.

    python benchmarks/act_rows.py --repeats 5
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ[_var] = "1"  # one BLAS thread, as in a worker (read when numpy loads)

import argparse  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from functools import partial  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
from _common import (  # noqa: E402
    ROOT,
    load_average,
    machine_info,
    markdown_table,
    median,
    update_section,
    write_json,
)

HERE = Path(__file__).resolve().parent
ROWS = (1, 8, 32, 64, 128, 256, 1024, 4096, 16384)
TORCH_THREADS = (1, 2)


def best_us(call: Callable[[], Any], calls: int, loops: int = 3) -> float:
    """Microseconds per call: the fastest of ``loops`` loops of ``calls`` calls."""
    for _ in range(calls // 10 + 1):
        call()
    best = float("inf")
    for _ in range(loops):
        t0 = time.perf_counter()
        for _ in range(calls):
            call()
        best = min(best, (time.perf_counter() - t0) / calls)
    return best * 1e6


def heads() -> dict[str, tuple[Any, int]]:
    """The networks timed, each with its observation width."""
    from daskrl.algos.categorical import DiscreteActorCritic
    from daskrl.algos.gaussian import GaussianActorCritic
    from daskrl.algos.normalize import Moments, Normalization

    gauss = GaussianActorCritic(17, 6, normalization=Normalization(obs=True, reward=True))
    assert gauss.obs_rms is not None
    gauss.obs_rms.update(Moments.of(np.random.default_rng(0).normal(size=(256, 17))))
    return {"categorical (4 -> 2)": (DiscreteActorCritic(4, 2), 4),
            "gaussian (17 -> 6)": (gauss, 17)}


def measure(repeats: int) -> dict[str, dict[int, dict[str, float]]]:
    """Median microseconds per ``act`` call of each path (numpy; torch on each of
    ``TORCH_THREADS``), by head and rows."""
    out: dict[str, dict[int, dict[str, float]]] = {}
    for name, (net, width) in heads().items():
        out[name] = {}
        for rows in ROWS:
            obs = np.random.default_rng(rows).normal(size=(rows, width)).astype(np.float32)
            gen = torch.Generator().manual_seed(0)
            calls = max(20, 4000 // rows)
            times: dict[str, list[float]] = {}
            for _ in range(repeats):
                for threads in TORCH_THREADS:  # numpy's BLAS keeps one thread throughout
                    torch.set_num_threads(threads)
                    paths = ("numpy", "torch") if threads == TORCH_THREADS[0] else ("torch",)
                    for path in paths:
                        key = path if path == "numpy" else f"torch_{threads}"
                        call = partial(getattr(net, f"_act_{path}"), obs, gen, False)
                        times.setdefault(key, []).append(best_us(call, calls))
            out[name][rows] = {k: float(median(v)) for k, v in times.items()}
            print(name, rows, out[name][rows], flush=True)
    torch.set_num_threads(1)
    return out


def act_path(rows: int, threads: int) -> str:
    """The path ``act`` takes for ``rows`` rows with ``threads`` torch threads.

    >>> act_path(4096, 1), act_path(4096, 2), act_path(8, 2)
    ('numpy', 'torch', 'numpy')
    """
    from daskrl.algos.twin_mlp import NUMPY_MAX_ROWS

    return "numpy" if rows <= NUMPY_MAX_ROWS or threads == 1 else "torch"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", type=Path, default=HERE / "results" / "act_rows.json")
    parser.add_argument("--md", type=Path, default=HERE / "act_cost.md")
    parser.add_argument("--section", default="act-rows")
    parser.add_argument("--no-md", action="store_true", help="print the table only")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats {args.repeats}: give at least 1")
    from daskrl.algos.twin_mlp import NUMPY_MAX_ROWS

    loads = [load_average()]
    got = measure(args.repeats)
    loads.append(load_average())
    write_json(args.json, {"machine": machine_info(), "loads": loads, "args": vars(args),
                           "numpy_max_rows": NUMPY_MAX_ROWS, "us_per_call": got})
    table = markdown_table(
        ["head", "rows", "numpy us/call", *(f"torch, {n} thread(s), us/call"
                                             for n in TORCH_THREADS),
         *(f"torch {n} / numpy" for n in TORCH_THREADS),
         *(f"act runs, {n} torch thread(s)" for n in TORCH_THREADS)],
        [[name, rows, t["numpy"], *(t[f"torch_{n}"] for n in TORCH_THREADS),
          *(t[f"torch_{n}"] / t["numpy"] for n in TORCH_THREADS),
          *(act_path(rows, n) for n in TORCH_THREADS)]
         for name, by_rows in got.items() for rows, t in by_rows.items()])
    start, end = loads[0]["load_1m"], loads[-1]["load_1m"]
    body = (f"`python benchmarks/act_rows.py --repeats {args.repeats}` (one process, numpy's "
            f"BLAS on one thread, torch on {' and '.join(map(str, TORCH_THREADS))}; medians "
            f"over {args.repeats} repeats of the fastest of 3 loops; 1-minute "
            f"load {start:.1f} at the start, {end:.1f} at the end, {os.cpu_count()} CPUs; "
            f"`NUMPY_MAX_ROWS` = {NUMPY_MAX_ROWS}; raw: `results/{args.json.name}`).\n\n"
            f"{table}\n")
    print(body)
    if not args.no_md:
        update_section(args.md, args.section, body)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
