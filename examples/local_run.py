"""Train PPO on CartPole from Python on a cluster made the way any Dask user makes one.

Run: ``python examples/local_run.py`` (about a minute on two cores). ``daskrl.train`` takes
any ``Client``: a ``LocalCluster``, an ``SSHCluster``, dask-jobqueue, ``dask worker``
processes; without one it starts an embedded cluster.
"""

from pathlib import Path

from distributed import Client, LocalCluster

import daskrl

GRAPH = Path(__file__).parents[1] / "graphs" / "ppo.py"

if __name__ == "__main__":
    with LocalCluster(n_workers=2, threads_per_worker=1) as cluster, Client(cluster) as client:
        print("dashboard:", client.dashboard_link)
        run = daskrl.train(GRAPH, client=client, steps=200_000, out="runs/example-local",
                           num_envs=8, num_steps=128)
    print({k: run.summary[k] for k in ("env_steps", "env_steps_per_s", "eval_return_mean")})
