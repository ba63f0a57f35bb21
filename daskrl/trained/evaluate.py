"""``daskrl eval``: a trained policy's episodes on fresh envs, optionally recorded to MP4.

An algorithm with its own ``evaluator`` (multi-agent teams, opponents, batched envs) runs the
episodes itself; every other one is evaluated here on single gymnasium envs through its
``make_policy`` module, so what is measured is exactly what ``daskrl export`` writes.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import torch

from daskrl.core.algorithm import EvalRequest
from daskrl.trained.load import TrainedRun, obs_shape

__all__ = ["evaluate_module", "evaluate_run", "format_result"]


def evaluate_run(run: TrainedRun, request: EvalRequest) -> dict[str, Any]:
    """The run's policy evaluated as ``request`` asks: by the algorithm's ``evaluator`` when
    it has one, else by :func:`evaluate_module` on ``request.env_id`` or the run's env.

    Examples
    --------
    >>> evaluate_run(load_run("runs/ppo-x"), EvalRequest(episodes=5))  # doctest: +SKIP
    {'eval_return_mean': 500.0, 'eval_return_std': 0.0, ...}
    """
    if request.episodes < 1:
        raise ValueError(f"--episodes must be >= 1, got {request.episodes}")
    if run.algo.evaluator is not None:
        result = dict(run.algo.evaluator(run.weights, request))
        result.setdefault("eval_episodes", request.episodes)
        result.setdefault("env_id", request.env_id or run.algo.env_id or run.algo.name)
        return result
    if request.opponent is not None:
        raise ValueError(f"--opponent: the {run.algo.name!r} algorithm has no evaluator of its "
                         "own (multi-agent runs only)")
    env_id = request.env_id or run.algo.env_id
    if env_id is None:
        raise ValueError(f"{run.out}: the run names no env id; pass --env ID")
    if request.env_id is not None:
        trained, asked = obs_shape(run.algo.env_id), obs_shape(request.env_id)
        if trained is not None and trained != asked:
            raise ValueError(f"--env {request.env_id}: observations of shape {asked}, the "
                             f"policy was trained on {run.algo.env_id} with {trained}")
    return evaluate_module(run.module(request.deterministic), env_id, request)


def _env(env_id: str, video_dir: Path | None, prefix: str) -> Any:
    import gymnasium as gym

    from daskrl.core.envs import check_env_id, make_env

    check_env_id(env_id)
    if video_dir is None:
        return make_env(env_id)  # as training saw it (Atari: preprocessed, frames stacked)
    try:
        import moviepy  # noqa: F401 - RecordVideo writes MP4 through it
    except ImportError:
        raise ValueError("--video needs moviepy: pip install 'daskrl[video]' (or "
                         "'gymnasium[other]')") from None
    env = make_env(env_id, render_mode="rgb_array")
    return gym.wrappers.RecordVideo(env, str(video_dir), episode_trigger=lambda _: True,
                                    name_prefix=prefix, disable_logger=True)


def evaluate_module(module: torch.nn.Module, env_id: str, request: EvalRequest
                    ) -> dict[str, Any]:
    """Mean and std of return and length over ``request.episodes`` episodes of ``env_id``,
    one env, episode ``i`` reset with seed ``request.seed + i`` (actions sampled from torch's
    generator seeded with ``request.seed`` when not deterministic).

    Examples
    --------
    >>> from daskrl.algos.networks import DiscreteActorCritic
    >>> pi = DiscreteActorCritic(4, 2).policy(True)
    >>> r = evaluate_module(pi, "CartPole-v1", EvalRequest(episodes=2))
    >>> r["eval_episodes"], r["eval_length_mean"] == r["eval_return_mean"]
    (2, True)
    """
    import gymnasium as gym

    env = _env(env_id, request.video_dir, f"eval-seed{request.seed}")
    discrete = isinstance(env.action_space, gym.spaces.Discrete)
    torch.manual_seed(request.seed)
    module.eval()
    returns, lengths = [], []
    try:
        for i in range(request.episodes):
            obs, _ = env.reset(seed=request.seed + i)
            total, steps, done = 0.0, 0, False
            while not done:
                with torch.inference_mode():
                    action = module(torch.as_tensor(np.asarray(obs)[None]))[0].cpu().numpy()
                obs, reward, terminated, truncated, _ = env.step(
                    int(action) if discrete else action.astype(env.action_space.dtype))
                total += float(reward)
                steps += 1
                done = bool(terminated or truncated)
            returns.append(total)
            lengths.append(steps)
    finally:
        env.close()
    result: dict[str, Any] = {
        "eval_return_mean": float(np.mean(returns)), "eval_return_std": float(np.std(returns)),
        "eval_length_mean": float(np.mean(lengths)), "eval_length_std": float(np.std(lengths)),
        "eval_episodes": request.episodes, "env_id": env_id,
    }
    if request.video_dir is not None:
        result["videos"] = sorted(str(p) for p in Path(request.video_dir).glob("*.mp4"))
    return result


def format_result(result: dict[str, Any]) -> str:
    """``daskrl eval``'s printout: mean ± std return and length, then any other numbers
    (per team for multi-agent evaluators).

    Examples
    --------
    >>> print(format_result({"eval_return_mean": 10.0, "eval_return_std": 2.0,
    ...                      "eval_length_mean": 10.0, "eval_length_std": 2.0,
    ...                      "eval_episodes": 3, "env_id": "CartPole-v1"}))
    CartPole-v1, 3 episodes: return 10 ± 2, length 10 ± 2
    """
    def pm(key: str) -> str | None:
        mean, std = result.get(f"{key}_mean"), result.get(f"{key}_std")
        if mean is None:
            return None
        return f"{mean:.4g} ± {std:.3g}" if std is not None and math.isfinite(std) else (
            f"{mean:.4g}")

    head = f"{result.get('env_id', 'eval')}, {result.get('eval_episodes', '?')} episodes"
    parts = [f"{name} {text}" for name, text in (("return", pm("eval_return")),
                                                  ("length", pm("eval_length"))) if text]
    shown = {"eval_return_mean", "eval_return_std", "eval_length_mean", "eval_length_std",
             "eval_episodes", "env_id", "videos"}
    extra = [f"  {k} = {v:.4g}" if isinstance(v, float) else f"  {k} = {v}"
             for k, v in sorted(result.items()) if k not in shown]
    lines = [f"{head}: {', '.join(parts)}", *extra]  # per team etc., one a line
    if result.get("videos"):
        lines.append("videos: " + ", ".join(result["videos"]))
    return "\n".join(lines)
