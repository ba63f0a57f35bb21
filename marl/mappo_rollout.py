"""MAPPO's actor side: batched multi-agent envs, fused team policies, rollouts with GAE.

An actor steps ``E`` environments of ``A`` agents on one device; at every step each team
acts with one forward pass over its ``E * A_team`` agents. After the rollout the critics
value all ``(T + 1) * E`` observations in a few large passes, and GAE runs per agent on
``(T, E * A)`` arrays.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from daskrl.algos.gae import gae

from .mappo_env import EnvSpec, layout_of, task_device
from .mappo_model import MAPPOModel, ModelSpec
from .team_layout import TeamLayout

HEADLINE_TEAM = "adversary"
"""The team whose return is ``episode_return_mean``/``eval_return_mean`` when an env has it
(simple tag); otherwise those are the mean over teams of the per-agent team returns."""


@dataclass(frozen=True)
class RolloutSpec:
    """How an actor turns steps into a batch.

    Parameters
    ----------
    gamma, gae_lambda : float
        Discount and GAE mixing.
    bootstrap_truncated : bool
        Bootstrap from the value of the final observation when an episode is cut at
        ``max_cycles`` (False: the cut is terminal, as MAPPO does on MPE).
    random_teams : tuple of str
        Teams that act uniformly at random and are not trained (fixed opponents).
    """

    gamma: float = 0.99
    gae_lambda: float = 0.95
    bootstrap_truncated: bool = False
    random_teams: tuple[str, ...] = ()


class EpisodeTracker:
    """Per-env, per-agent episode returns; team means of each finished episode.

    Examples
    --------
    >>> lay = TeamLayout(("adversary", "good"), ((0, 1), (2,)), (4, 4, 4), 5)
    >>> tr = EpisodeTracker(lay, 2, "cpu")
    >>> tr.add(torch.tensor([[1.0, 1.0, -2.0], [0.0, 0.0, 0.0]]), torch.tensor([True, False]))
    tensor([0])
    >>> tr.team_returns, tr.headline
    ({'adversary': [1.0], 'good': [-2.0]}, [1.0])
    """

    def __init__(self, layout: TeamLayout, num_envs: int, device: str | torch.device) -> None:
        self.layout = layout
        self.ret = torch.zeros(num_envs, layout.num_agents, dtype=torch.float64, device=device)
        self.length = torch.zeros(num_envs, dtype=torch.long, device=device)
        self.index = [torch.tensor(a, device=device) for a in layout.agents]
        self.headline_team = (layout.names.index(HEADLINE_TEAM)
                              if HEADLINE_TEAM in layout.names else None)
        self.clear()

    def clear(self) -> None:
        """Forget the finished episodes (the running ones continue)."""
        self.last_means: Tensor | None = None
        """Team means ``[R, teams]`` of the rows :meth:`add` last finished."""
        self.team_returns: dict[str, list[float]] = {n: [] for n in self.layout.names}
        self.headline: list[float] = []
        self.lengths: list[int] = []

    def add(self, reward: Tensor, reset_mask: Tensor | None) -> Tensor | None:
        """Add a step's rewards ``[E, A]``; record the envs in ``reset_mask`` as finished.

        Returns the finished rows (or None)."""
        self.ret += reward
        self.length += 1
        if reset_mask is None or not bool(reset_mask.any()):
            return None
        rows = reset_mask.nonzero().squeeze(1)
        done = self.ret[rows]
        means = torch.stack([done[:, idx].mean(1) for idx in self.index], 1)  # [R, teams]
        head = means[:, self.headline_team] if self.headline_team is not None else means.mean(1)
        for t, name in enumerate(self.layout.names):
            self.team_returns[name].extend(means[:, t].tolist())
        self.headline.extend(head.tolist())
        self.lengths.extend(self.length[rows].tolist())
        self.last_means = means
        self.ret[rows] = 0.0
        self.length[rows] = 0
        return rows


def advantages(rewards: Tensor, values: Tensor, next_values: Tensor, terminated: Tensor,
               done: Tensor, gamma: float, gae_lambda: float) -> tuple[Tensor, Tensor]:
    """GAE on ``(T, N)`` tensors: :func:`daskrl.algos.gae.gae` on CPU (zero-copy numpy
    views), :func:`gae_tensor` on other devices.

    Examples
    --------
    >>> r = torch.ones(2, 1); z = torch.zeros(2, 1); f = torch.zeros(2, 1, dtype=torch.bool)
    >>> adv, ret = advantages(r, z, z, f, f, 0.5, 1.0)
    >>> adv[:, 0].tolist()
    [1.5, 1.0]
    """
    if rewards.device.type == "cpu":
        adv, ret = gae(rewards.numpy(), values.numpy(), next_values.numpy(), terminated.numpy(),
                       done.numpy(), gamma, gae_lambda)
        return torch.from_numpy(adv), torch.from_numpy(ret)
    return gae_tensor(rewards, values, next_values, terminated, done, gamma, gae_lambda)


def gae_tensor(rewards: Tensor, values: Tensor, next_values: Tensor, terminated: Tensor,
               done: Tensor, gamma: float, gae_lambda: float) -> tuple[Tensor, Tensor]:
    """:func:`daskrl.algos.gae.gae` in torch, on the tensors' device (same arguments).

    Examples
    --------
    >>> r = torch.ones(2, 1); z = torch.zeros(2, 1); f = torch.zeros(2, 1, dtype=torch.bool)
    >>> gae_tensor(r, z, z, f, f, 0.5, 1.0)[0][:, 0].tolist()
    [1.5, 1.0]
    """
    deltas = rewards + gamma * next_values * (~terminated) - values
    carry = gamma * gae_lambda * (~done)
    adv = torch.empty_like(deltas)
    last = torch.zeros_like(deltas[0])
    for t in range(len(deltas) - 1, -1, -1):
        last = deltas[t] + carry[t] * last
        adv[t] = last
    return adv, adv + values


class MAPPOActor:
    """Batched envs and the team policies, resident on a worker (role ``rollout``).

    Parameters
    ----------
    env : EnvSpec
        The env to build.
    model : ModelSpec
        The network settings (must match the learner's).
    rollout : RolloutSpec
        GAE and opponent settings.
    num_envs : int
        Environments ``E`` stepped together.
    seed : int
        Seeds the envs and the action sampling.
    device : str
        ``"auto"`` (a GPU when the task holds one, see :func:`task_device`), ``"cpu"``,
        ``"cuda"``.

    Examples
    --------
    >>> actor = MAPPOActor(EnvSpec(), ModelSpec(), RolloutSpec(), num_envs=4, seed=0)
    >>> batch = actor.rollout(25)
    >>> batch["obs"].shape, batch["advantages"].shape, batch["stats"]["agent_steps"]
    ((100, 4, 16), (100, 4), 400)
    >>> sorted(batch["stats"]["team_returns"])
    ['adversary', 'good']
    """

    def __init__(self, env: EnvSpec, model: ModelSpec, rollout: RolloutSpec, num_envs: int,
                 seed: int, device: str = "auto") -> None:
        self.env_spec, self.model_spec, self.spec = env, model, rollout
        self.num_envs, self.seed, self.requested_device = num_envs, seed, device
        self.layout = layout_of(env)
        self.random_teams = frozenset(self.layout.team_index(n) for n in rollout.random_teams)
        self.version = -1
        self._env: Any = None
        self._pending: dict[str, Tensor] | None = None

    def _build(self) -> None:
        self.device = task_device(self.requested_device)
        self._env = self.env_spec.make(self.num_envs, self.seed, self.device)
        self.obs = self._env.reset(seed=self.seed).float()
        self.model = MAPPOModel(self.layout, self.model_spec).to(self.device)
        self.generator = torch.Generator(device=self.device).manual_seed(self.seed)
        self.tracker = EpisodeTracker(self.layout, self.num_envs, self.device)
        if self._pending is not None:
            self.model.load_state_dict(self._pending)
            self._pending = None

    @property
    def env(self) -> Any:
        """The batched env (built on first use, on this task's device)."""
        if self._env is None:
            self._build()
        return self._env

    def resized(self, num_envs: int, seed: int) -> MAPPOActor:
        """The same settings with ``num_envs`` envs and ``seed`` (fusion, ``single``)."""
        return MAPPOActor(self.env_spec, self.model_spec, self.spec, num_envs, seed,
                          self.requested_device)

    def set_weights(self, weights: dict[str, Tensor], version: int) -> None:
        """Load the learner's weights unless ``version`` is already loaded."""
        if version == self.version:
            return
        if self._env is None:
            self._pending = weights
        else:
            self.model.load_state_dict(weights)
        self.version = version

    def act(self, obs: Tensor) -> tuple[Tensor, Tensor]:
        """Every agent's action ``[E, A]`` and log-probability at one step (what
        :meth:`collect` calls; a league's actor seats other policies in some envs)."""
        return self.model.act(obs, self.generator, random_teams=self.random_teams)

    def learning(self) -> Tensor | None:
        """Which teams learn from each env's current step, ``[E, teams]`` bool, or None when
        every team learns everywhere (then batches carry no ``learn`` mask)."""
        return None

    def episodes_finished(self, rows: Tensor, team_means: Tensor) -> None:
        """Called when the envs ``rows`` finished an episode (``team_means`` ``[R, teams]``:
        each team's mean return in it), before their next episode's first step."""

    def rollout(self, num_steps: int) -> dict[str, Any]:
        """Step every env ``num_steps`` times; return numpy arrays ``[T * E, A, ...]`` with
        advantages and returns, and ``stats``."""
        batch = self.collect(num_steps)
        out: dict[str, Any] = {k: v.cpu().numpy() for k, v in batch.items() if k != "stats"}
        out["stats"] = batch["stats"]
        return out

    @torch.no_grad()
    def collect(self, num_steps: int) -> dict[str, Any]:
        """:meth:`rollout` with the arrays left as tensors on the actor's device."""
        env, model, spec = self.env, self.model, self.spec
        t_start, cpu_start = time.time(), time.thread_time()
        obs = self.obs
        (e, a, d), t_max, dev = obs.shape, num_steps, obs.device
        b_obs = torch.empty(t_max + 1, e, a, d, device=dev)
        b_act = torch.empty(t_max, e, a, dtype=torch.long, device=dev)
        b_logp, b_rew = torch.empty(t_max, e, a, device=dev), torch.empty(t_max, e, a, device=dev)
        b_term = torch.zeros(t_max, e, a, dtype=torch.bool, device=dev)
        b_done = torch.zeros(t_max, e, a, dtype=torch.bool, device=dev)
        finals: list[tuple[int, Tensor, Tensor]] = []
        learn: list[Tensor] = []
        self.tracker.clear()
        inference_s = env_s = 0.0  # the profiler's split of the rollout (host-side clocks)
        for t in range(t_max):
            b_obs[t] = obs
            t0 = time.perf_counter()
            b_act[t], b_logp[t] = self.act(obs)
            mask = self.learning()
            if mask is not None:
                learn.append(mask.clone())
            t1 = time.perf_counter()
            obs, rew, term, trunc, info = env.step(b_act[t])
            inference_s, env_s = inference_s + t1 - t0, env_s + time.perf_counter() - t1
            obs = obs.float()
            b_rew[t] = rew
            b_done[t] = term | trunc
            b_term[t] = term if spec.bootstrap_truncated else b_done[t]
            rows = self.tracker.add(rew, info.get("reset_mask"))
            if rows is not None:
                self.episodes_finished(rows, self.tracker.last_means)
            if spec.bootstrap_truncated and rows is not None:
                finals.append((t, rows, info["final_obs"][rows].float()))
        b_obs[t_max] = obs
        self.obs = obs
        t0 = time.perf_counter()
        values = model.value(b_obs.view((t_max + 1) * e, a, d)).view(t_max + 1, e, a)
        inference_s += time.perf_counter() - t0
        next_values = values[1:].clone()
        for t, rows, final_obs in finals:
            next_values[t, rows] = model.value(final_obs)
        n = e * a
        adv, ret = advantages(b_rew.view(t_max, n), values[:t_max].reshape(t_max, n),
                              next_values.view(t_max, n), b_term.view(t_max, n),
                              b_done.view(t_max, n), spec.gamma, spec.gae_lambda)
        tr = self.tracker
        stats = {
            "env_steps": t_max * e, "agents": n, "agent_steps": t_max * n,
            "episode_returns": tr.headline, "episode_lengths": tr.lengths,
            "team_returns": tr.team_returns, "t_start": t_start, "t_end": time.time(),
            "policy_version": self.version, "env_s": env_s, "inference_s": inference_s,
            "cpu_s": time.thread_time() - cpu_start,  # this thread's CPU: less load-sensitive
        }
        slots = t_max * e
        out = {"obs": b_obs[:t_max].view(slots, a, d), "actions": b_act.view(slots, a),
               "logp": b_logp.view(slots, a), "values": values[:t_max].reshape(slots, a),
               "advantages": adv.view(slots, a), "returns": ret.view(slots, a), "stats": stats}
        if learn:  # [T * E, teams]: whose moves each (step, env) slot trains
            out["learn"] = torch.stack(learn).view(slots, -1)
        return out

    def close(self) -> None:
        """Close the envs."""
        if self._env is not None:
            getattr(self._env, "close", lambda: None)()


def play_episodes(env: EnvSpec, net: MAPPOModel, seed: int, episodes: int,
                  deterministic: bool, random_teams: frozenset[int]) -> dict[str, np.ndarray]:
    """Per-episode team returns ``{team: [episodes]}`` (each the mean over the team's agents)
    of ``episodes`` fresh episodes, one per env; teams in ``random_teams`` act uniformly.

    Examples
    --------
    >>> lay = layout_of(EnvSpec())
    >>> out = play_episodes(EnvSpec(), MAPPOModel(lay, ModelSpec()), 0, 3, True, frozenset())
    >>> {k: v.shape for k, v in out.items()}
    {'adversary': (3,), 'good': (3,)}
    """
    layout = net.layout
    batched = env.make(episodes, seed)
    obs = batched.reset(seed=seed).float()
    tracker = EpisodeTracker(layout, episodes, "cpu")
    finished = torch.zeros(episodes, dtype=torch.bool)
    generator = torch.Generator().manual_seed(seed)
    team: dict[str, list[float]] = {n: [] for n in layout.names}
    for _ in range(100 * env.max_cycles):
        actions, _ = net.act(obs, generator, deterministic, random_teams)
        obs, rew, _, _, info = batched.step(actions)
        obs = obs.float()
        tracker.clear()
        rows = tracker.add(rew.double(), info.get("reset_mask"))
        if rows is None:
            continue
        first = (~finished[rows]).numpy()  # only each env's first episode counts
        for name in layout.names:
            team[name] += np.asarray(tracker.team_returns[name])[first].tolist()
        finished[rows] = True
        if bool(finished.all()):
            break
    getattr(batched, "close", lambda: None)()
    return {n: np.asarray(v) for n, v in team.items()}


def mean_se(x: np.ndarray) -> tuple[float, float]:
    """Mean and its standard error (``std(ddof=1) / sqrt(n)``; 0 for one value).

    Examples
    --------
    >>> mean_se(np.array([1.0, 3.0]))
    (2.0, 1.0)
    """
    n = len(x)
    return float(np.mean(x)), float(np.std(x, ddof=1) / np.sqrt(n)) if n > 1 else 0.0


def evaluate_teams(env: EnvSpec, model: ModelSpec, weights: dict[str, Tensor], seed: int,
                   episodes: int = 32, deterministic: bool = True,
                   random_teams: tuple[str, ...] = (), opponent: str | None = None
                   ) -> dict[str, float]:
    """Team returns of fresh episodes in three match-ups, each mean ± standard error over
    ``episodes`` episodes (a team's return in an episode: the mean over its agents).

    * ``eval_return_mean/<team>``, ``eval_return_se/<team>``: the teams as trained (trained
      against trained; teams in ``random_teams`` act uniformly at random);
    * ``eval_vs_random_return_mean/<team>`` (and ``_se``): each trained team against
      uniformly random other teams (only when the env has more than one team);
    * ``eval_random_return_mean/<team>`` (and ``_se``): every team uniformly random, the
      baseline the others are read against.

    Random teams sample uniformly in every mode, also when ``deterministic`` makes the
    trained teams greedy. ``eval_return_mean``/``eval_return_se``/``eval_return_std`` are the
    headline team's (the adversaries' when the env has them, else the mean over teams) in the
    as-trained match-up, or in the against-random one when ``opponent="random"``.

    Examples
    --------
    >>> lay = layout_of(EnvSpec())
    >>> w = MAPPOModel(lay, ModelSpec()).state_dict()
    >>> out = evaluate_teams(EnvSpec(), ModelSpec(), w, seed=0, episodes=2)
    >>> sorted(k for k in out if k.endswith("/adversary"))  # doctest: +NORMALIZE_WHITESPACE
    ['eval_random_return_mean/adversary', 'eval_random_return_se/adversary',
     'eval_return_mean/adversary', 'eval_return_se/adversary',
     'eval_vs_random_return_mean/adversary', 'eval_vs_random_return_se/adversary']
    """
    if opponent not in (None, "random"):
        raise ValueError(f"opponent={opponent!r}: use None (trained against trained) or 'random'")
    layout = layout_of(env)
    net = MAPPOModel(layout, model)
    net.load_state_dict(weights)
    teams = range(len(layout.names))
    random = frozenset(layout.team_index(n) for n in random_teams)
    out: dict[str, float] = {}

    def record(prefix: str, returns: dict[str, np.ndarray], only: set[str] | None = None) -> None:
        for name, x in returns.items():
            if only is None or name in only:
                out[f"{prefix}_mean/{name}"], out[f"{prefix}_se/{name}"] = mean_se(x)

    trained = play_episodes(env, net, seed, episodes, deterministic, random)
    record("eval_return", trained)
    vs_random: dict[str, np.ndarray] = {}  # each trained team's own return against random
    if len(layout.names) > 1:
        for t in teams:
            if t in random:
                continue
            name = layout.names[t]
            vs = play_episodes(env, net, seed, episodes, deterministic, frozenset(teams) - {t})
            vs_random[name] = vs[name]
            record("eval_vs_random_return", vs, {name})
    record("eval_random_return", play_episodes(env, net, seed, episodes, deterministic,
                                               frozenset(teams)))
    headline = vs_random if opponent == "random" and vs_random else trained
    head = (headline[HEADLINE_TEAM] if HEADLINE_TEAM in headline
            else np.mean(list(headline.values()), axis=0))
    mean, se = mean_se(head)
    out.update(eval_return_mean=mean, eval_return_se=se, eval_return_std=float(np.std(head)),
               eval_episodes=len(head))
    return out
