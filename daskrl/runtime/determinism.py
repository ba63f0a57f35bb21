"""What ``--deterministic`` covers, as a run records it in ``summary.json``.

A run is bit-identical whatever the workers when every source of difference between two runs
is held fixed. The record says which were, so that a user comparing two runs can see why
they may differ (threads, the order replicas' batches merge in, MKL's kernel choice by
alignment, the placement of fused envs), and the warning below names a worker that would
break the promise before any task runs.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

from daskrl.cluster.forkserver import WORKER_NUMERICS
from daskrl.distributions import Distribution

NUMERICS = tuple(WORKER_NUMERICS)
"""The environment variables whose value in each worker the record reports."""

SEEDS = ("each rollout replica's envs and action noise: SeedSequence(seed, replica, the "
         "iteration it was built at); the learner's weights, minibatch order and update "
         "noise: its own generator from SeedSequence(seed, 0); the evaluation: "
         "SeedSequence(seed, 0, 10000)")
"""Where the algorithms' randomness comes from (the same in both modes)."""


def determinism_record(deterministic: bool, distribution: Distribution,
                       environ: Mapping[str, Mapping[str, str | None]]) -> dict[str, Any]:
    """The ``determinism`` entry of ``summary.json``.

    ``environ`` is each worker's :data:`NUMERICS` (``Backend.worker_environ``).

    Examples
    --------
    >>> from daskrl.distributions import get_distribution
    >>> rec = determinism_record(True, get_distribution("actors-learner"),
    ...                          {"w0": {"MKL_CBWR": "AUTO"}})
    >>> rec["threads_per_task"], rec["replica_merge_order"], rec["bit_identical"]
    (1, 'replica index', True)
    >>> determinism_record(False, get_distribution("impala"), {})["replica_merge_order"]
    'arrival (the order batches or gradients land)'
    """
    ordered = distribution.deterministic
    cbwr = {w: env.get("MKL_CBWR") for w, env in sorted(environ.items())}
    return {
        "bit_identical": bool(deterministic and ordered and all(cbwr.values())),
        "threads_per_task": 1 if deterministic else "the task's CPU grant",
        "torch_deterministic_algorithms": deterministic,
        "replica_merge_order": ("replica index" if ordered
                                else "arrival (the order batches or gradients land)"),
        "fused_envs": ("never" if deterministic
                       else "co-located replicas may run as one actor (actors-learner's fuse)"),
        "out_of_turn": "fails the run" if deterministic else "runs after a note on stderr",
        "mkl_cbwr": cbwr,
        "seeds": SEEDS,
    }


def warn_unpinned_numerics(environ: Mapping[str, Mapping[str, str | None]]) -> list[str]:
    """Before a deterministic run: one line on stderr naming the workers whose MKL picks its
    kernels by data alignment (``MKL_CBWR`` unset), and how to fix it; returns them.

    Examples
    --------
    >>> warn_unpinned_numerics({"w0": {"MKL_CBWR": "AUTO"}})
    []
    """
    loose = sorted(w for w, env in environ.items() if not env.get("MKL_CBWR"))
    if loose:
        print(f"daskrl: --deterministic: worker(s) {', '.join(loose)} run without MKL_CBWR, "
              "so MKL's results depend on where data lands in memory; start them with "
              "MKL_CBWR=AUTO in their environment (daskrl's own clusters do)",
              file=sys.stderr)
    return loose
