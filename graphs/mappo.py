"""MAPPO on batched multi-agent envs, as fragments any distribution can place.

Run: ``daskrl train graphs/mappo.py --env simple_tag --steps 2000000``
(``--distribution actors-learner``, ``single`` or ``data-parallel``; ``central-inference``
and ``async`` refuse it at once: its actor is not split into env and inference parts, and
it computes no gradients of its own).

An actor replica holds ``--num-envs`` environments of all their agents and the team
policies, resident on its worker; each step, each team acts with one forward pass over all
its agents. The learner holds the team actors, critics (``--critic central``: MAPPO,
``local``: IPPO) and the optimiser. ``--steps`` counts env steps (each moves every agent of
its env). Metrics add ``return_mean/<team>``, ``agents`` and ``agent_steps_per_s``; the final
evaluation adds ``eval_return_mean/<team>`` (as trained), ``eval_vs_random_return_mean/<team>``
(each trained team against uniformly random other teams) and ``eval_random_return_mean/<team>``
(all random), each with its standard error (``..._se/<team>``); ``eval_return_mean`` is the
adversary team's return when the env has one (simple tag), else the mean over teams.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any, Literal

import torch

from daskrl import Algorithm, Resources, setting
from daskrl.core.algorithm import EvalRequest
from daskrl.core.sizes import Sizes, mlp_params, transition_bytes
from marl.mappo import (
    EnvSpec,
    MAPPOActor,
    MAPPOHyper,
    MAPPOLearner,
    MAPPOModel,
    MAPPOPolicy,
    ModelSpec,
    RolloutSpec,
    TeamLayout,
    evaluate_teams,
    layout_of,
)


@dataclass
class Config:
    """MAPPO settings; each field is a ``--flag`` of ``daskrl train graphs/mappo.py``."""

    env: str = setting("simple_tag (batched), an mpe2 task (simple, simple_adversary, "
                     "simple_crypto, simple_push, simple_reference, simple_speaker_listener, "
                     "simple_spread, simple_world_comm) or a PettingZoo env module "
                     "(e.g. mpe2.simple_tag_v3)", "simple_tag")
    num_good: int = setting("simple_tag: good agents (prey)", 1)
    num_adversaries: int = setting("simple_tag: adversaries (predators)", 3)
    num_obstacles: int = setting("simple_tag: obstacles", 2)
    num_agent_neighbors: int = setting("simple_tag: observe only the k nearest agents (0: all)", 0)
    num_agents: int = setting("simple_spread: agents N", 3)
    max_cycles: int = setting("steps per episode", 25)
    critic: Literal["central", "local"] = setting(
        "central (MAPPO: global state + own obs) or local (IPPO: own obs)", "central")
    state: Literal["concat", "pooled"] = setting(
        "global state: concat (all observations) or pooled (team means)", "concat")
    random_teams: str = setting("comma-separated teams that act at random and are not trained "
                              "(e.g. good)", "")
    num_actors: int = setting("actor replicas (each with its own envs)", 1)
    num_envs: int = setting("envs per actor replica", 128)
    num_steps: int = setting("steps per env per rollout", 25)
    update_epochs: int = setting("passes over each batch", 10)
    num_minibatches: int = setting("minibatches (of whole (step, env) slots) per epoch", 1)
    learning_rate: float = setting("Adam learning rate", 7e-4)
    anneal_lr: bool = setting("anneal the learning rate linearly to 0", False)
    gamma: float = setting("discount factor", 0.99)
    gae_lambda: float = setting("GAE lambda", 0.95)
    clip_coef: float = setting("surrogate and value clipping coefficient", 0.2)
    ent_coef: float = setting("entropy bonus coefficient", 0.01)
    vf_coef: float = setting("value loss coefficient", 1.0)
    max_grad_norm: float = setting("gradient-norm clip of each team's actor and critic", 10.0)
    value_norm: bool = setting("normalise value targets (MAPPO's ValueNorm)", True)
    bootstrap_truncated: bool = setting("bootstrap values at the max_cycles cut (default: the "
                                      "cut is terminal, as MAPPO on MPE)", False)
    hidden: int = setting("hidden units in each of the two layers", 64)
    compile: bool = setting(
        "compile each whole gradient step (loss, gradients, clip and Adam step) with "
        "torch.compile: the first step compiles (seconds; inductor's on-disk cache in "
        "$TORCHINDUCTOR_CACHE_DIR spares later runs most of it)", False)
    device: str = setting("auto (a GPU when the task holds one), cpu, or cuda (actors fail "
                        "on a worker without one)", "auto")
    eval_episodes: int = setting("episodes in the final evaluation", 100)
    eval_deterministic: bool = setting("evaluate greedy actions (else sampled)", True)

    def env_spec(self) -> EnvSpec:
        """The env settings."""
        return EnvSpec(self.env, self.max_cycles, self.num_good, self.num_adversaries,
                       self.num_obstacles, self.num_agent_neighbors, self.num_agents)

    def model_spec(self) -> ModelSpec:
        """The network settings."""
        return ModelSpec(self.critic, self.state, (self.hidden,) * 2, self.value_norm)

    def random(self) -> tuple[str, ...]:
        """The ``--random-teams``, as a tuple."""
        return tuple(t.strip() for t in self.random_teams.split(",") if t.strip())

    def rollout_spec(self) -> RolloutSpec:
        """GAE and opponent settings."""
        return RolloutSpec(self.gamma, self.gae_lambda, self.bootstrap_truncated, self.random())

    def hyper(self, layout: TeamLayout) -> MAPPOHyper:
        """Update settings; teams in ``--random-teams`` are not trained."""
        random = self.random()
        for name in random:
            layout.team_index(name)  # raises, listing the teams
        return MAPPOHyper(
            update_epochs=self.update_epochs, num_minibatches=self.num_minibatches,
            learning_rate=self.learning_rate, anneal_lr=self.anneal_lr, clip_coef=self.clip_coef,
            ent_coef=self.ent_coef, vf_coef=self.vf_coef, max_grad_norm=self.max_grad_norm,
            trained_teams=tuple(n for n in layout.names if n not in random),
            compile=self.compile)


def make_actor(config: Config, seed: int) -> MAPPOActor:
    """Role ``rollout``: one replica's envs and team policies (on a GPU when its task has one)."""
    return MAPPOActor(config.env_spec(), config.model_spec(), config.rollout_spec(),
                      config.num_envs, seed, config.device)


def make_learner(config: Config, layout: TeamLayout, seed: int, device: str) -> MAPPOLearner:
    """Role ``learner``: team actors, critics and optimiser on ``device`` (the GPU of its task,
    if any); ``--device cpu`` keeps it on the CPU, ``--device cuda`` puts it on a GPU wherever
    torch sees one."""
    if config.device == "cpu" or (config.device != "auto" and torch.cuda.is_available()):
        device = config.device
    return MAPPOLearner(layout, config.model_spec(), config.hyper(layout), seed, device)


def evaluate(config: Config, weights: dict, seed: int) -> dict[str, float]:
    """Role ``evaluate``: ``--eval-episodes`` fresh episodes, one per env, on the CPU, as
    trained, each trained team against random teams, and all random (mean ± s.e.)."""
    return evaluate_teams(config.env_spec(), config.model_spec(), weights, seed,
                          config.eval_episodes, config.eval_deterministic, config.random())


def evaluator(config: Config, weights: dict, request: EvalRequest) -> dict[str, Any]:
    """``daskrl eval``: :func:`marl.mappo.evaluate_teams` with the request's episodes, seed and
    mode; ``--opponent random`` makes the headline each trained team against random ones.
    ``--video DIR`` also writes MP4s of up to three more episodes, the teams as trained
    (:func:`marl.mappo_video.record_episodes`; needs the ``video`` extra)."""
    if request.env_id is not None and request.env_id != config.env:
        raise ValueError(f"--env {request.env_id!r}: a MAPPO run evaluates on the env it "
                         f"trained on ({config.env!r}); drop --env")
    result: dict[str, Any] = evaluate_teams(
        config.env_spec(), config.model_spec(), weights, request.seed, request.episodes,
        request.deterministic, config.random(), opponent=request.opponent)
    if request.video_dir is not None:
        from marl.mappo_video import record_episodes

        paths = record_episodes(config.env_spec(), config.model_spec(), weights,
                                request.video_dir, request.seed, request.episodes,
                                request.deterministic, config.random())
        result["videos"] = [str(p) for p in paths]
    return result


def make_policy(config: Config, weights: dict, deterministic: bool) -> MAPPOPolicy:
    """The trained team actors as one module: ``forward(obs [B, A, obs_dim]) -> actions
    [B, A]``, observations in the batched env's layout (agents in ``agent_names`` order,
    each zero-padded to the widest observation); ``--random-teams`` act uniformly."""
    layout = layout_of(config.env_spec())
    model = MAPPOModel(layout, config.model_spec())
    model.load_state_dict(weights)
    random = frozenset(layout.team_index(n) for n in config.random())
    return MAPPOPolicy(model, deterministic, random).eval()


def model_params(layout: TeamLayout, spec: ModelSpec) -> int:
    """Parameters of the team actors and critics, counted without building them (a central
    critic over many agents is large): for the memory check before launch."""
    dims = [layout.team_obs_dim(t) for t in range(len(layout.names))]
    state = 0 if spec.critic != "central" else (
        layout.state_dim if spec.state == "concat" else sum(dims))
    return sum(mlp_params(d, layout.team_num_actions(t), spec.hidden)
               + mlp_params(d + state, 1, spec.hidden) for t, d in enumerate(dims))


def build(config: Config) -> Algorithm:
    """MAPPO as an :class:`~daskrl.Algorithm`; the distribution decides where each role runs."""
    layout = layout_of(config.env_spec())  # checks the env and reads its teams
    config.hyper(layout)  # checks --random-teams and the update settings
    config.model_spec()
    if config.device not in ("auto", "cpu") and not config.device.startswith("cuda"):
        raise ValueError(f"--device {config.device!r}: use auto, cpu or cuda")
    if config.num_envs * config.num_steps < config.num_minibatches:
        raise ValueError(f"--num-minibatches {config.num_minibatches} exceeds the "
                         f"{config.num_envs * config.num_steps} (step, env) slots of a rollout: "
                         "lower it or raise --num-envs")
    return Algorithm(
        name="mappo",
        make_actor=partial(make_actor, config),
        make_learner=partial(make_learner, config, layout),
        evaluate=partial(evaluate, config),
        evaluator=partial(evaluator, config),
        make_policy=partial(make_policy, config),
        num_steps=config.num_steps,
        num_envs=config.num_envs,
        num_actors=config.num_actors,
        resources={
            "rollout": Resources(cpu=1),
            "learner": Resources(gpu=1, fallback=Resources(cpu=1)),
            "evaluate": Resources(cpu=1),
        },
        sizes=Sizes(transition_bytes(layout.obs_dim, layout.num_agents),
                    model_params(layout, config.model_spec())),
        # MAPPOActor.resized fuses replicas; MAPPOLearner's gradients can be averaged. Its
        # actor steps envs and policies in one loop (no split-actor: not central-inference)
        # and computes no gradients itself (no gradient-actor: not async).
        capabilities={"gradients", "resizable-actor"},
    )
