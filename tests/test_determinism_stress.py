"""``--deterministic`` under stress: every distribution and algorithm that claims it gives one
``weights_sha256`` over runs on one and two worker processes, each run twice; the others are
refused in one line; and what could make two runs differ is pinned in the workers
(MKL's kernel choice by alignment) or fails the run (a rollout out of turn).

Two rollout replicas everywhere: on one worker they run at once in two threads of one
process (shared process state: torch's global generator, BLAS pools, the heap), on two
workers apart.
"""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from distributed import Client, LocalCluster

from daskrl.core.script import load_graph
from daskrl.core.worker_state import OutOfTurn, drop_run, in_turn
from daskrl.distributions import get_distribution
from daskrl.runtime.driver import RunSettings, train

REPO = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.timeout(600)


def _graph(name: str) -> types.ModuleType:
    return load_graph(str(REPO / "graphs" / f"{name}.py"))


TINY: dict[str, dict[str, Any]] = {
    "ppo": {"num_actors": 2, "num_envs": 4, "num_steps": 32, "update_epochs": 2,
            "num_minibatches": 2},
    "dqn": {"num_actors": 2, "num_envs": 2, "num_steps": 32, "hidden": 32,
            "learning_starts": 64, "batch_size": 16},
    "sac": {"num_actors": 2, "num_envs": 1, "num_steps": 32, "hidden": 32,
            "learning_starts": 32, "batch_size": 16, "buffer_size": 4096},
    "mappo": {"num_actors": 2, "num_envs": 4, "num_steps": 10, "update_epochs": 2,
              "hidden": 32},
}
"""Small runs of each algorithm: 2 replicas, a few env steps per iteration."""


def _algo(name: str):
    graph = _graph(name)
    return graph.build(graph.Config(**TINY.get(name, {})))


def _train(client: Client, algo, spec: str, out: Path, iterations: int = 4) -> dict:
    settings = RunSettings(out=out, steps=iterations * algo.steps_per_iteration, seed=11,
                           eval=False, progress=False, tensorboard=False, deterministic=True)
    return train(client, algo, get_distribution(spec), settings)


CLAIMS = [
    ("ppo", "actors-learner"), ("ppo", "actors-learner:stale=1"), ("ppo", "central-inference"),
    ("ppo", "data-parallel"), ("ppo", "single"),
    ("dqn", "single"), ("dqn", "actors-learner"),
    ("sac", "single"), ("sac", "actors-learner"),
    ("mappo", "actors-learner"), ("mappo", "single"),
]


@pytest.mark.parametrize(("name", "spec"), CLAIMS, ids=[f"{n}-{s}" for n, s in CLAIMS])
def test_one_hash_over_one_and_two_workers_each_run_twice(cluster_pair, tmp_path, name, spec):
    algo = _algo(name)
    runs = [(n, _train(cluster_pair[n], algo, spec, tmp_path / f"w{n}-{k}"))
            for k in range(2) for n in (1, 2)]
    hashes = {f"{n} worker(s), run {k % 2 + 1}": s["weights_sha256"][:12]
              for k, (n, s) in enumerate(runs)}
    assert len(set(hashes.values())) == 1, hashes
    assert len({s["env_steps"] for _, s in runs}) == 1
    for n, summary in runs:
        used = set(sum(summary["placement"].values(), []))
        assert len(used) == (1 if n == 1 or spec == "single" else 2), summary["placement"]
        record = summary["determinism"]
        assert record["bit_identical"] and record["threads_per_task"] == 1, record
        assert set(record["mkl_cbwr"].values()) == {"AUTO"}, record


@pytest.mark.parametrize(("name", "spec"), [("impala", "impala"), ("a3c", "async"),
                                            ("dqn", "apex")])
def test_distributions_whose_results_follow_arrival_order_are_refused_in_one_line(
        cluster_pair, tmp_path, name, spec):
    algo = _algo(name)
    with pytest.raises(ValueError, match=r"^--deterministic: ") as info:
        _train(cluster_pair[1], algo, spec, tmp_path / "refused")
    assert "\n" not in str(info.value)
    assert not (tmp_path / "refused").exists()  # refused before anything was written


def _alignment_variants() -> tuple[int, int, str | None]:
    """How many different results MKL gives for one ``(8, 64) @ (64, 2)`` product (a
    policy head) over 16 alignments of its input, in this process; how many numpy's BLAS
    gives for the same product (the actors' numpy path, ``TwinMLP.run_numpy``); and
    ``MKL_CBWR``."""
    import os

    import torch

    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    x0 = torch.randn(8, 64, generator=g).numpy()
    w, b = torch.randn(2, 64, generator=g), torch.randn(2, generator=g)
    seen, seen_numpy = set(), set()
    wt, bn = w.t().contiguous().numpy(), b.numpy()
    for offset in range(16):
        buf = np.zeros(8 * 64 + 16, dtype=np.float32)
        x = buf[offset:offset + 8 * 64].reshape(8, 64)
        x[:] = x0
        seen.add(torch.nn.functional.linear(torch.as_tensor(x), w, b).numpy().tobytes())
        seen_numpy.add((x @ wt + bn).tobytes())
    return len(seen), len(seen_numpy), os.environ.get("MKL_CBWR")


def test_worker_products_do_not_depend_on_where_data_lands(cluster_pair):
    """Tensors that arrive in message frames sit at any alignment: in daskrl's workers MKL
    still takes one code path (``MKL_CBWR``), so the bits do not follow the address."""
    for client in cluster_pair.values():
        for variants, numpy_variants, cbwr in client.run(_alignment_variants).values():
            assert (variants, numpy_variants, cbwr) == (1, 1, "AUTO")


def test_a_rollout_out_of_turn_fails_a_deterministic_run_and_only_warns_otherwise():
    """Iteration 1 of some envs whose iteration 0 never ran on the worker: after the wait,
    a deterministic run stops with the reason; otherwise it goes on with a note."""

    def step(strict: bool) -> str:
        with in_turn(("stress", "rollout", int(strict)), 1, after=0, wait_s=0.3,
                     strict=strict):
            return "ran"

    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                      dashboard_address=None) as cluster, Client(cluster) as client:
        assert client.submit(step, False, pure=False).result(timeout=60) == "ran"
        with pytest.raises(OutOfTurn, match="cannot step these envs out of order"):
            client.submit(step, True, pure=False).result(timeout=60)
        client.run(drop_run, "stress")
