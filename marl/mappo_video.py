"""MP4 videos of a trained MAPPO policy's episodes (``daskrl eval RUN --video DIR``).

The batched envs have no window: frames are drawn here from the entities' positions and
sizes (agents and landmarks as filled circles on a square canvas, the view spanning at
least ``[-1, 1]^2`` and growing to keep every entity in sight, as mpe2's own renderer does),
for the batched :class:`~marl.simple_tag.SimpleTag` (adversaries red, good agents green,
obstacles grey) and for mpe2 tasks through :class:`~marl.pettingzoo.PettingZooBatchEnv`
(each entity in mpe2's own colour). Frames are written by ``imageio-ffmpeg`` (installed
with moviepy by the ``video`` extra).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from .mappo_env import EnvSpec, layout_of
from .mappo_model import MAPPOModel, ModelSpec

__all__ = ["VIDEO_EPISODES", "draw_frame", "entities", "record_episodes", "write_mp4"]

VIDEO_EPISODES = 3
"""Episodes recorded at most per call (one MP4 each): a video is for looking at."""

_TAG_COLOURS = {0: (0.85, 0.35, 0.35), 1: (0.35, 0.85, 0.35)}  # adversary, good (as mpe2)
_OBSTACLE = (0.25, 0.25, 0.25)


def entities(env: Any, row: int) -> list[tuple[float, float, float, tuple[float, float, float]]]:
    """``(x, y, radius, rgb)`` of every entity of environment ``row`` of a batched env,
    landmarks first so that agents are drawn over them.

    Examples
    --------
    >>> from marl.simple_tag import SimpleTag
    >>> env = SimpleTag(2); _ = env.reset(seed=0)
    >>> len(entities(env, 1)), entities(env, 1)[0][2]
    (6, 0.2)
    """
    from .pettingzoo import PettingZooBatchEnv
    from .simple_tag import SimpleTag

    if isinstance(env, SimpleTag):
        c = env.constants
        out = [(float(x), float(y), 0.2, _OBSTACLE) for x, y in env.landmark_pos[row].tolist()]
        for (x, y), r, good in zip(env.agent_pos[row].tolist(), c.size.tolist(),
                                   c.is_good.tolist(), strict=True):
            out.append((float(x), float(y), float(r), _TAG_COLOURS[int(good)]))
        return out
    if isinstance(env, PettingZooBatchEnv):
        world = env.envs[row].unwrapped.world
        ordered = [*world.landmarks, *world.agents]
        return [(float(e.state.p_pos[0]), float(e.state.p_pos[1]), float(e.size),
                 tuple(float(v) for v in np.asarray(e.color)[:3])) for e in ordered]
    raise ValueError(f"--video: cannot draw a {type(env).__name__}; videos need the batched "
                     "simple_tag or an mpe2 task")


def draw_frame(items: list[tuple[float, float, float, tuple[float, float, float]]],
               size: int = 400) -> np.ndarray:
    """An RGB frame ``[size, size, 3]`` (uint8) of ``items`` (:func:`entities`), y upwards.

    Examples
    --------
    >>> f = draw_frame([(0.0, 0.0, 0.5, (1.0, 0.0, 0.0))], size=64)
    >>> f.shape, f.dtype, f[32, 32].tolist(), f[0, 0].tolist()
    ((64, 64, 3), dtype('uint8'), [255, 0, 0], [255, 255, 255])
    """
    frame = np.full((size, size, 3), 255, dtype=np.uint8)
    half = max([1.0] + [max(abs(x), abs(y)) + r for x, y, r, _ in items])
    scale = size / (2 * half)
    grid = (np.arange(size) + 0.5) / scale - half  # pixel centres in world units
    for x, y, r, rgb in items:
        inside = (grid[None, :] - x) ** 2 + (grid[::-1, None] - y) ** 2 <= r * r
        frame[inside] = (np.clip(np.asarray(rgb), 0, 1) * 255).astype(np.uint8)
    return frame


def write_mp4(frames: list[np.ndarray], path: Path, fps: int = 10) -> Path:
    """Write ``frames`` (RGB uint8, all one size) to an H.264 MP4 at ``path``, every frame
    kept, through ``imageio-ffmpeg`` (moviepy's writer, installed with the ``video`` extra;
    moviepy's own clip writer can drop the last frame when ``len(frames) / fps`` does not
    round-trip in floating point, e.g. 8 frames at 10 fps).

    Examples
    --------
    >>> import tempfile, imageio_ffmpeg  # doctest: +SKIP
    >>> with tempfile.TemporaryDirectory() as d:  # doctest: +SKIP
    ...     p = write_mp4([np.zeros((16, 16, 3), np.uint8)] * 8, Path(d) / "v.mp4")
    ...     imageio_ffmpeg.count_frames_and_secs(str(p))[0]
    8

    (Skipped in the doctests, which run without the ``video`` extra;
    ``tests/test_marl_eval.py`` counts the frames of real videos.)
    """
    try:
        import imageio_ffmpeg
    except ImportError:
        raise ValueError("--video needs moviepy and imageio-ffmpeg: pip install "
                         "'daskrl[video]'") from None
    path.parent.mkdir(parents=True, exist_ok=True)
    h, w = frames[0].shape[:2]
    writer = imageio_ffmpeg.write_frames(str(path), (w, h), fps=fps, codec="libx264",
                                         macro_block_size=1, output_params=["-loglevel",
                                                                            "error"])
    writer.send(None)  # start ffmpeg
    try:
        for frame in frames:
            writer.send(np.ascontiguousarray(frame))
    finally:
        writer.close()
    return path


@torch.no_grad()
def record_episodes(env: EnvSpec, model: ModelSpec, weights: dict[str, Tensor],
                    video_dir: str | Path, seed: int, episodes: int = VIDEO_EPISODES,
                    deterministic: bool = True, random_teams: tuple[str, ...] = (),
                    prefix: str = "eval", size: int = 400) -> list[Path]:
    """Play ``min(episodes, VIDEO_EPISODES)`` fresh episodes (one env each, the teams as
    trained, ``random_teams`` uniformly random) and write one MP4 per episode to
    ``video_dir`` (``<prefix>-seed<seed>-episode-<i>.mp4``, ``max_cycles`` frames: the
    state before each step). Returns the paths.

    Examples
    --------
    >>> import tempfile
    >>> w = MAPPOModel(layout_of(EnvSpec()), ModelSpec()).state_dict()
    >>> with tempfile.TemporaryDirectory() as d:  # doctest: +SKIP
    ...     [p.name for p in record_episodes(EnvSpec(), ModelSpec(), w, d, 0, 1)]
    ['eval-seed0-episode-0.mp4']
    """
    layout = layout_of(env)
    net = MAPPOModel(layout, model)
    net.load_state_dict(weights)
    random = frozenset(layout.team_index(n) for n in random_teams)
    n = max(1, min(int(episodes), VIDEO_EPISODES))
    batched = env.make(n, seed)
    obs = batched.reset(seed=seed).float()
    generator = torch.Generator().manual_seed(seed)
    frames: list[list[np.ndarray]] = [[] for _ in range(n)]
    live = np.ones(n, dtype=bool)
    try:
        for _ in range(env.max_cycles):
            for row in np.flatnonzero(live):
                frames[row].append(draw_frame(entities(batched, int(row)), size))
            actions, _ = net.act(obs, generator, deterministic, random)
            obs, _, _, _, info = batched.step(actions)
            obs = obs.float()
            done = info.get("reset_mask")
            if done is not None:
                live &= ~done.cpu().numpy()
            if not live.any():
                break
    finally:
        getattr(batched, "close", lambda: None)()
    out = Path(video_dir)
    return [write_mp4(f, out / f"{prefix}-seed{seed}-episode-{i}.mp4")
            for i, f in enumerate(frames)]
