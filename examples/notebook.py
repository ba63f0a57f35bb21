# %% [markdown]
# # daskrl in a notebook
# Cells of a notebook (``# %%``: VS Code, Jupytext, Spyder open them as such), using only
# daskrl's public API: train on your own Dask cluster, watch the run while the notebook
# keeps working, stop it, read its metrics, use the trained policy.
# Run as a script: ``python examples/notebook.py``.

# %%
import time
from pathlib import Path

import gymnasium as gym
from distributed import Client, LocalCluster

import daskrl

GRAPH = Path(__file__).parents[1] / "graphs" / "ppo.py"

# Any Dask cluster: LocalCluster, SSHCluster, dask-jobqueue, `dask worker` processes.
# Thread workers share this process: give them the process's memory budget.
cluster = LocalCluster(n_workers=2, processes=False, threads_per_worker=1, memory_limit="4GiB")
client = Client(cluster)
print("dashboard:", client.dashboard_link)

# %% Train in the background: the call returns at once (a tqdm progress bar follows it).
run = daskrl.train(GRAPH, client=client, steps=40_000, out="runs/notebook", wait=False,
                   num_envs=8, num_steps=128)
print(run)

# %% Meanwhile: the metrics so far, one row per iteration (needs pandas).
while run.progress == 0 and run.status == "running":
    time.sleep(1)  # the first iteration is on its way
print(run.metrics[["env_steps", "episode_return_mean"]].tail())

# %% Wait for the end (or `run.stop()` to end it now, with a checkpoint).
run.result()
print(run.status, {k: run.summary[k] for k in ("env_steps", "eval_return_mean")})

# %% The trained policy: observations in, actions out.
policy = run.policy()
env = gym.make("CartPole-v1")
obs, _ = env.reset(seed=0)
total, done = 0.0, False
while not done:
    obs, reward, terminated, truncated, _ = env.step(int(policy(obs)))
    total, done = total + reward, terminated or truncated
print("one episode's return:", total)

# %%
client.close()
cluster.close()
