"""Vector environments built from env ids (gymnasium's, or EnvPool's), checked before any
long work.

Atari ids (``ALE/Breakout-v5``, ``BreakoutNoFrameskip-v4``) get gymnasium's
``AtariPreprocessing`` (no-op starts, frame skip 4, 84x84 grayscale) and a stack of 4 frames:
uint8 observations of shape ``(4, 84, 84)``, what the Nature-DQN CNN head takes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal

import gymnasium as gym
import numpy as np

Backend = Literal["gymnasium", "envpool"]
"""Who steps the envs: gymnasium's vector envs (Python), or EnvPool's C++ thread pool."""

ATARI_INSTALL = 'pip install -e ".[atari]"  (ale-py and opencv-python-headless)'
ENVPOOL_INSTALL = 'pip install -e ".[envpool]"'
FRAME_STACK = 4


def is_atari(env_id: str) -> bool:
    """Whether ``env_id`` names an Arcade Learning Environment game.

    Examples
    --------
    >>> is_atari("ALE/Breakout-v5"), is_atari("PongNoFrameskip-v4"), is_atari("CartPole-v1")
    (True, True, False)
    """
    return env_id.startswith("ALE/") or "NoFrameskip" in env_id


def _register_atari(env_id: str) -> None:
    """Register ale-py's envs with gymnasium, or say in one line how to install them."""
    try:
        import ale_py
    except ImportError:
        raise ValueError(f"env {env_id!r} is an Atari game and ale-py is not installed: "
                         f"{ATARI_INSTALL}") from None
    gym.register_envs(ale_py)


def check_env_id(env_id: str) -> None:
    """Raise ``ValueError`` naming ``env_id`` if gymnasium does not know it.

    Examples
    --------
    >>> check_env_id("CartPole-v1")
    """
    if is_atari(env_id):
        _register_atari(env_id)
    try:
        gym.spec(env_id)
    except Exception as exc:  # gymnasium raises several error types here
        close = [k for k in gym.registry if k.lower().startswith(env_id.split("-")[0].lower())]
        hint = f" (did you mean {', '.join(sorted(close)[:3])}?)" if close else ""
        raise ValueError(f"unknown env id {env_id!r}{hint}: {exc}") from None


class FireReset(gym.Wrapper):
    """Press FIRE after every reset in games that wait for it (Breakout): a policy that has
    not learnt to fire would otherwise idle until the 27,000-step limit (as in the DQN, SB3
    and CleanRL set-ups, and EnvPool's ``use_fire_reset``)."""

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        """Reset, then step FIRE (and reset again if that ended the episode)."""
        obs, info = self.env.reset(**kwargs)
        obs, _, term, trunc, info = self.env.step(1)
        if term or trunc:
            obs, info = self.env.reset(**kwargs)
        return obs, info


def _fire_reset(env: gym.Env) -> gym.Env:
    meanings = env.unwrapped.get_action_meanings()
    return FireReset(env) if len(meanings) > 1 and meanings[1] == "FIRE" else env


def _atari_wrappers() -> list[Any]:
    from gymnasium.wrappers import AtariPreprocessing, FrameStackObservation

    return [AtariPreprocessing, _fire_reset,
            partial(FrameStackObservation, stack_size=FRAME_STACK)]


def _atari_kwargs(env_id: str) -> dict[str, Any]:
    # AtariPreprocessing skips frames itself and refuses an env that skips too
    return {"frameskip": 1} if gym.spec(env_id).kwargs.get("frameskip", 1) != 1 else {}


def make_env(env_id: str, **kwargs: Any) -> gym.Env:
    """One env as training sees it (Atari games preprocessed and frame-stacked), for
    evaluation and videos; ``kwargs`` go to ``gym.make`` (e.g. ``render_mode``).

    Examples
    --------
    >>> make_env("CartPole-v1").observation_space.shape
    (4,)
    """
    check_env_id(env_id)
    if not is_atari(env_id):
        return gym.make(env_id, **kwargs)
    env = gym.make(env_id, **_atari_kwargs(env_id), **kwargs)
    for wrap in _atari_wrappers():
        env = wrap(env)
    return env


class SyncVectorEnvNoInfo(gym.vector.SyncVectorEnv):
    """gymnasium's ``SyncVectorEnv`` whose ``step`` returns no infos (``{}``).

    Merging every env's info dict into the vector info (``_add_info``) and the generic
    ``iterate``/``concatenate`` over the spaces cost about as much per step as a MuJoCo
    step; an actor that reads none of it skips them. Observations, rewards, terminations,
    truncations and the next-step auto-reset are gymnasium's, bit for bit (other auto-reset
    modes and non-array observations take gymnasium's own ``step``).

    Examples
    --------
    >>> env = SyncVectorEnvNoInfo([partial(make_env, "CartPole-v1")] * 2)
    >>> _ = env.reset(seed=0)
    >>> obs, rew, term, trunc, info = env.step(np.zeros(2, np.int64))
    >>> obs.shape, info
    ((2, 4), {})
    """

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict]:
        """Step every env (resetting those that finished at the previous step)."""
        out = self._observations
        if (self.autoreset_mode != gym.vector.AutoresetMode.NEXT_STEP
                or not isinstance(out, np.ndarray)):
            obs, rew, term, trunc, _ = super().step(actions)
            return obs, rew, term, trunc, {}
        rewards, terms, truncs = self._rewards, self._terminations, self._truncations
        for i, env in enumerate(self.envs):
            if self._autoreset_envs[i]:
                obs, _ = env.reset()
                rewards[i], terms[i], truncs[i] = 0.0, False, False
            else:
                obs, rewards[i], terms[i], truncs[i], _ = env.step(actions[i])
            self._env_obs[i] = obs
            out[i] = obs
        self._autoreset_envs = terms | truncs
        return (out.copy() if self.copy else out, rewards.copy(), terms.copy(), truncs.copy(),
                {})


def make_vector_env(env_id: str, num_envs: int, seed: int, backend: Backend = "gymnasium",
                    infos: bool = True) -> Any:
    """A vector env of ``num_envs`` copies, numpy-vectorised when the env offers it.

    Uses the env's own vector entry point (e.g. CartPole's numpy implementation) when it
    has one, else a synchronous vector env; ``backend="envpool"`` steps EnvPool's C++ envs
    instead (:class:`EnvPoolVectorEnv`). Auto-reset follows gymnasium's default next-step
    mode (EnvPool's too): the step after an episode ends returns the reset observation.
    ``infos=False``: ``step`` returns an empty info dict (:class:`SyncVectorEnvNoInfo`, for
    callers that read none).

    Examples
    --------
    >>> env = make_vector_env("CartPole-v1", 4, seed=0)
    >>> env.observation_space.shape
    (4, 4)
    """
    if num_envs < 1:
        raise ValueError(f"num_envs must be >= 1, got {num_envs}")
    if backend == "envpool":
        return EnvPoolVectorEnv(env_id, num_envs, seed)
    if backend != "gymnasium":
        raise ValueError(f"unknown env backend {backend!r}: choose gymnasium or envpool")
    check_env_id(env_id)
    if gym.spec(env_id).vector_entry_point is not None and not is_atari(env_id):
        env = gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="vector_entry_point")
    else:  # module-level env makers, so the vector env pickles (deterministic snapshots)
        vec = gym.vector.SyncVectorEnv if infos else SyncVectorEnvNoInfo
        env = vec([partial(make_env, env_id) for _ in range(num_envs)])
    env.reset(seed=seed)
    env.action_space.seed(seed)
    return env


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask where the OS has one).

    Examples
    --------
    >>> usable_cpus() >= 1
    True
    """
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # no affinity masks (macOS, Windows)
        return os.cpu_count() or 1


def envpool_id(env_id: str) -> str:
    """The EnvPool task id of a gymnasium env id (``ALE/Breakout-v5``, ``BreakoutNoFrameskip-v4``
    -> ``Breakout-v5``; others unchanged).

    Examples
    --------
    >>> envpool_id("ALE/Pong-v5"), envpool_id("PongNoFrameskip-v4"), envpool_id("Hopper-v5")
    ('Pong-v5', 'Pong-v5', 'Hopper-v5')
    """
    if env_id.startswith("ALE/"):
        return env_id[4:]
    if "NoFrameskip" in env_id:
        return env_id.split("NoFrameskip")[0] + "-v5"
    return env_id


class EnvPoolVectorEnv:
    """EnvPool's vector env behind the part of gymnasium's ``VectorEnv`` API the actors use.

    EnvPool steps all envs in C++ threads; its Atari envs do the same preprocessing as
    :func:`make_env` (84x84 grayscale, frame skip 4, 4 stacked frames, no-op starts) and it
    resets a finished env on the next step, as gymnasium's next-step auto-reset does.

    Examples
    --------
    >>> import pytest; _ = pytest.importorskip("envpool")
    >>> env = EnvPoolVectorEnv("CartPole-v1", 2, seed=0)
    >>> env.reset(seed=0)[0].shape, env.single_action_space
    ((2, 4), Discrete(2))
    """

    def __init__(self, env_id: str, num_envs: int, seed: int) -> None:
        try:
            import envpool
        except ImportError:
            raise ValueError(f"--env-backend envpool needs EnvPool: {ENVPOOL_INSTALL}") from None
        task = envpool_id(env_id)
        known = envpool.list_all_envs()
        if task not in known:
            close = sorted(k for k in known if k.split("-")[0] == task.split("-")[0])[:3]
            hint = f" (it has {', '.join(close)})" if close else ""
            raise ValueError(f"env {env_id!r} is not in EnvPool{hint}: use --env-backend "
                             "gymnasium")
        # EnvPool takes an int32 seed; replica seeds are drawn from [0, 2**32). Its default
        # is a thread per env: more threads than this process's CPUs only contend for them.
        self.num_threads = min(num_envs, usable_cpus())
        self.env = envpool.make(task, env_type="gymnasium", num_envs=num_envs,
                                seed=seed % 2**31, num_threads=self.num_threads)
        self.num_envs = num_envs
        self.single_observation_space = self.env.observation_space
        self.single_action_space = self.env.action_space

    def reset(self, seed: int | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        """Reset every env (EnvPool's seed was given at construction)."""
        obs, info = self.env.reset()
        return obs, info

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, ...]:
        """Step every env: observation, reward, terminated, truncated, info."""
        return self.env.step(actions)

    def close(self) -> None:
        """Close the envs."""
        self.env.close()


def env_spaces(env_id: str, backend: Backend = "gymnasium") -> tuple[gym.Space, gym.Space]:
    """The single observation and action spaces of ``env_id`` (one env is built to read them).

    Examples
    --------
    >>> env_spaces("Pendulum-v1")[1]
    Box(-2.0, 2.0, (1,), float32)
    """
    probe = make_vector_env(env_id, 1, seed=0, backend=backend)
    try:
        return probe.single_observation_space, probe.single_action_space
    finally:
        probe.close()


def space_dims(env: gym.vector.VectorEnv) -> tuple[int, int]:
    """Flat observation size and number of discrete actions of a vector env.

    Raises
    ------
    ValueError
        If the single observation space is not a flat Box or the action space not Discrete.
    """
    obs_space, act_space = env.single_observation_space, env.single_action_space
    if not isinstance(obs_space, gym.spaces.Box):
        raise ValueError(f"observation space {obs_space} is not a Box: use a flattening wrapper")
    if not isinstance(act_space, gym.spaces.Discrete):
        raise ValueError(f"action space {act_space} is not Discrete: PPO here needs discrete")
    return int(np.prod(obs_space.shape)), int(act_space.n)


@dataclass
class EnvStep:
    """What one step of a vector env returns, with the episodes it finished.

    ``obs`` is the observation after the step (the final observation when an episode ended
    there; gymnasium resets it on the next step, which is then not ``valid``).
    """

    obs: np.ndarray
    reward: np.ndarray
    terminated: np.ndarray
    done: np.ndarray
    valid: np.ndarray
    episode_returns: list[float] = field(default_factory=list)
    episode_lengths: list[int] = field(default_factory=list)
