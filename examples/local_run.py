"""Train PPO on CartPole from Python on a cluster made the way any Dask user makes one.

Run: ``python examples/local_run.py`` (about a minute on two cores; ``--steps`` and
``--out`` change the budget and the run's folder). ``daskrl.train`` takes
any ``Client``: a ``LocalCluster``, an ``SSHCluster``, dask-jobqueue, ``dask worker``
processes; without one it starts an embedded cluster.
"""

import argparse
from pathlib import Path

from distributed import Client, LocalCluster

import daskrl

GRAPH = Path(__file__).parents[1] / "graphs" / "ppo.py"

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200_000, help="env steps (default 200000)")
    parser.add_argument("--out", default="runs/example-local", help="the run's folder")
    args = parser.parse_args()
    with LocalCluster(n_workers=2, threads_per_worker=1) as cluster, Client(cluster) as client:
        print("dashboard:", client.dashboard_link)
        run = daskrl.train(GRAPH, client=client, steps=args.steps, out=args.out,
                           num_envs=8, num_steps=128)
    print({k: run.summary[k] for k in ("env_steps", "env_steps_per_s", "eval_return_mean")})
