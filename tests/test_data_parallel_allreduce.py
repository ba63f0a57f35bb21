"""Data-parallel MAPPO: gloo's all-reduce against the Dask path's averaging, bit for bit, and
where a replica's update spends its time (``round_split``)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from daskrl.distributions.data_parallel import mean_of
from daskrl.distributions.replica import ReplicaUpdate, digest, round_split, sync_rounds
from marl.mappo import (
    EnvSpec,
    MAPPOActor,
    MAPPOHyper,
    MAPPOLearner,
    ModelSpec,
    RolloutSpec,
    layout_of,
)

ROOT = Path(__file__).resolve().parent.parent
SHORT = EnvSpec("simple_tag", max_cycles=8, num_good=2, num_adversaries=3)
HP = MAPPOHyper(update_epochs=2, num_minibatches=2)

# One replica of a 2-rank gloo group: the same learner and rollout as ``_pair`` below,
# averaged by ``all_reduce_mean`` (the allreduce=torch path); prints its weight digest.
CHILD = textwrap.dedent("""
    import sys, torch, torch.distributed as dist
    torch.set_num_threads(1)
    sys.path.insert(0, sys.argv[4])
    from test_data_parallel_allreduce import replica_setup
    from daskrl.distributions.replica import ReplicaUpdate, digest
    from daskrl.distributions.torch_allreduce import all_reduce_mean
    rank, world = int(sys.argv[1]), int(sys.argv[2])
    dist.init_process_group("gloo", init_method="file://" + sys.argv[3], rank=rank,
                            world_size=world)
    learner, batch = replica_setup(rank)
    update = ReplicaUpdate(learner, [batch], 0.0)
    flat = update.start()
    while flat is not None:
        flat = update.step(all_reduce_mean(flat, world))
    update.finish()
    print("DIGEST", digest(learner.weights()), flush=True)
    dist.destroy_process_group()
""")


# Both replicas averaged in one process like the Dask path, and the summed mutation.
REFERENCE = textwrap.dedent("""
    import sys
    sys.path.insert(0, sys.argv[1])
    from test_data_parallel_allreduce import _pair
    print("PLAIN", *_pair()[0], flush=True)
    print("SUMMED", *_pair(lambda a, b: a + b)[0], flush=True)
""")


def replica_setup(rank: int) -> tuple[MAPPOLearner, dict]:
    """Replica ``rank``'s learner (the same initial weights everywhere) and its own rollout."""
    learner = MAPPOLearner(layout_of(SHORT), ModelSpec(), HP, seed=0)
    batch = MAPPOActor(SHORT, ModelSpec(), RolloutSpec(), 4, seed=1 + rank).rollout(8)
    return learner, batch


def _pair(average=None) -> tuple[list[str], list[ReplicaUpdate]]:
    """Both replicas in this process, averaged like the Dask path (``mean_of``)."""
    average = average or (lambda a, b: mean_of(a, b, count=2))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in the children and in a Dask worker
    try:
        pairs = [replica_setup(r) for r in range(2)]
        updates = [ReplicaUpdate(lr, [b], 0.0) for lr, b in pairs]
        flats = [u.start() for u in updates]
        while flats[0] is not None:
            mean = average(*flats)
            flats = [u.step(mean) for u in updates]
        for u in updates:
            u.finish()
    finally:
        torch.set_num_threads(threads)
    return [digest(lr.weights()) for lr, _ in pairs], updates


def test_gloo_all_reduce_gives_the_dask_paths_parameters(tmp_path):
    """Two gloo ranks (two processes) end an update with the weights of the in-process Dask
    averaging, bit for bit; a wrong mean (the sum, not divided) does not."""
    pytest.importorskip("torch.distributed")
    if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
        pytest.skip("torch without gloo")
    # Every process computes with MKL in one mode: MKL fixes its mode (MKL_CBWR) at a
    # process's first call, so this one's, set before anything ran here, may differ.
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MKL_CBWR": "AUTO"}
    store = tmp_path / "store"
    here = str(Path(__file__).resolve().parent)
    procs = [subprocess.Popen([sys.executable, "-c", CHILD, str(r), "2", str(store), here],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                              cwd=ROOT) for r in range(2)]
    procs.append(subprocess.Popen([sys.executable, "-c", REFERENCE, here],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  env=env, cwd=ROOT))
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-2000:]

    def line(out: str, tag: str) -> list[str]:
        return next(x.split()[1:] for x in out.splitlines() if x.startswith(tag))

    gloo = [line(out, "DIGEST")[0] for out, _ in outs[:2]]
    plain, summed = line(outs[2][0], "PLAIN"), line(outs[2][0], "SUMMED")
    assert gloo[0] == gloo[1] == plain[0] == plain[1]
    assert summed[0] == summed[1] != plain[0]  # a mutation of the mean: must not match


def test_phases_record_every_round_of_both_replicas():
    """Each replica stamps every sync round (ready, back), round 0 carries the value
    normalisers' statistics, and ``round_split`` gives each replica its own phases."""
    _, updates = _pair()
    rounds = sync_rounds(updates[0].learner)
    summaries = [u.phases.summary() for u in updates]
    for s in summaries:
        assert len(s["ready"]) == len(s["back"]) == rounds and s["statistics"]
        assert all(b >= r for r, b in zip(s["ready"], s["back"], strict=True))
        assert s["cpu"]["compute"] > 0 and s["wall"]["apply"] > 0
    split = round_split(summaries)
    assert split["dp/rounds"] == rounds and "dp/stats_round_s" in split
    for r in range(2):
        assert split[f"dp/compute_cpu_s/r{r}"] == summaries[r]["cpu"]["compute"]
    # in each round the replica ready last waits for nobody, the other for the gap between
    # them: the two waits add up to the gaps (a wait counted from the wrong end does not)
    gaps = sum(abs(a - b) for a, b in zip(summaries[0]["ready"], summaries[1]["ready"],
                                          strict=True))
    assert split["dp/wait_s/r0"] + split["dp/wait_s/r1"] == pytest.approx(gaps)


def test_round_split_blames_the_replica_that_was_ready_first():
    """Replica 1 is always ready 0.5 s after replica 0: replica 0 waited, replica 1 did
    not; the all-reduce is what remains until the first average came back."""
    ready0 = [10.0, 20.0, 30.0]
    fast = {"wall": {}, "cpu": {}, "ready": ready0, "back": [t + 0.6 for t in ready0],
            "statistics": True}
    slow = {"wall": {}, "cpu": {}, "ready": [t + 0.5 for t in ready0],
            "back": [t + 0.7 for t in ready0], "statistics": True}
    split = round_split([fast, slow])
    assert split["dp/wait_s/r0"] == pytest.approx(1.5)
    assert split["dp/wait_s/r1"] == 0.0
    assert split["dp/first_wait_s/r0"] == pytest.approx(0.5)  # the rollout/update boundary
    assert split["dp/first_wait_s/r1"] == 0.0
    assert split["dp/sync_s"] == pytest.approx(0.3)
    assert split["dp/stats_round_s"] == pytest.approx(0.1)
