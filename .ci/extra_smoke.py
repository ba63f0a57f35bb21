"""The smoke of one extra in an environment where only it is installed (``.ci/extras.sh``):
what the README says the extra is for, done once. Exits non-zero with the failure."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np


def daskrl(*args: str) -> None:
    """Run the CLI as a user would; fail with its stderr."""
    done = subprocess.run([sys.executable, "-m", "daskrl.cli", *args], capture_output=True,
                          text=True, timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"daskrl {' '.join(args)} failed:\n{done.stderr[-3000:]}")


def tiny_run(root: Path, *extra: str) -> None:
    """A 1,024-step PPO run on CartPole in this process's scheduler, into ./run."""
    daskrl("train", str(root / "graphs" / "ppo.py"), "--steps", "1024", "--num-envs", "4",
           "--scheduler", "sync", "--no-progress", "--out", "run", *extra)


def step(env_id: str, backend: str = "gymnasium") -> None:
    """Make ``env_id`` through daskrl's env layer and take a few random steps."""
    from daskrl.core.envs import make_vector_env

    envs = make_vector_env(env_id, 2, seed=0, backend=backend)
    envs.reset(seed=0)
    space = envs.single_action_space  # what every vector env here declares
    for _ in range(8):
        envs.step(np.stack([space.sample() for _ in range(envs.num_envs)]))
    envs.close()


def main(extra: str, root: Path) -> None:
    if extra == "mujoco":
        step("Hopper-v5")
    elif extra == "atari":
        step("ALE/Pong-v5")
    elif extra == "envpool":
        step("CartPole-v1", backend="envpool")
    elif extra == "video":
        tiny_run(root, "--no-eval")
        daskrl("eval", "run", "--episodes", "1", "--video", "videos")
        if not list(Path("videos").rglob("*.mp4")):
            raise SystemExit("daskrl eval --video wrote no .mp4")
    elif extra == "mlflow":
        tiny_run(root, "--no-eval", "--track", "mlflow")
        if not list(Path(".").rglob("meta.yaml")):
            raise SystemExit("--track mlflow recorded no run")
    elif extra == "notebook":
        import daskrl as api

        run = api.train(str(root / "graphs" / "ppo.py"), steps=1024, num_envs=4, out="run",
                        progress=False)
        frame = run.metrics
        if type(frame).__name__ != "DataFrame" or frame.empty:
            raise SystemExit(f"Run.metrics gave {type(frame).__name__}, not a filled DataFrame")
    elif extra == "graph":
        daskrl("graph", str(root / "graphs" / "ppo.py"), "--out", "ppo.svg")
        if b"<svg" not in Path("ppo.svg").read_bytes():
            raise SystemExit("daskrl graph wrote no SVG")
    elif extra == "sweep":  # Optuna proposes, rliable reports
        daskrl("sweep", str(root / "graphs" / "ppo.py"), "--search", "optuna", "--trials", "2",
               "--space", "learning_rate=1e-4:1e-2:log", "--steps", "1024", "--num-envs", "4",
               "--workers", "1", "--no-progress", "--out", "sweep")
        if "IQM" not in Path("sweep/report.md").read_text():
            raise SystemExit("daskrl sweep wrote no report")
    elif extra == "bench":  # the learning suite beside SB3, rliable's intervals, Box2D
        step("LunarLander-v3")
        done = subprocess.run([sys.executable, str(root / "benchmarks" / "learning.py"),
                               "--quick"], capture_output=True, text=True, timeout=600)
        if done.returncode != 0 or "IQM" not in done.stdout:
            raise SystemExit(f"benchmarks/learning.py --quick failed:\n{done.stderr[-3000:]}")
    else:
        raise SystemExit(f"no smoke for the extra {extra!r}")


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
