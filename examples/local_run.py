"""Train PPO on CartPole on an embedded local cluster, from Python instead of the CLI.

Run: ``python examples/local_run.py`` (about a minute on two cores).
"""

from pathlib import Path

from distributed import Client

from daskrl.cluster.local import default_worker_resources, local_cluster
from daskrl.core.script import load_graph
from daskrl.distributions import get_distribution
from daskrl.runtime.driver import RunSettings, train

if __name__ == "__main__":
    ppo = load_graph(str(Path(__file__).parents[1] / "graphs" / "ppo.py"))
    algo = ppo.build(ppo.Config(num_envs=8, num_steps=128))
    with local_cluster(default_worker_resources(2)) as cluster, Client(cluster) as client:
        print("dashboard:", client.dashboard_link)
        summary = train(client, algo, get_distribution("actors-learner"),
                        RunSettings(out=Path("runs/example-local"), steps=200_000))
    print({k: summary[k] for k in ("env_steps", "env_steps_per_s", "eval_return_mean")})
