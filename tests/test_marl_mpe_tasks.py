"""MAPPO and IPPO on every mpe2 parallel env through the PettingZoo adapter, including teams
with their own observation widths and action counts (a short smoke run per env)."""

from __future__ import annotations

import mpe2  # noqa: F401 - the reference envs (test extra): missing is a failure
import numpy as np
import pytest
import torch

from marl.mappo import (  # noqa: E402
    EnvSpec,
    MAPPOHyper,
    MAPPOModel,
    MAPPOPolicy,
    ModelSpec,
    evaluate_teams,
    layout_of,
    train_inline,
)
from marl.mappo_env import MPE_TASKS  # noqa: E402

# team -> (observation width, actions) as mpe2 defines them
SPACES = {
    "simple": {"agent": (4, 5)},
    "simple_adversary": {"adversary": (8, 5), "agent": (10, 5)},
    "simple_crypto": {"eve": (4, 4), "bob": (8, 4), "alice": (8, 4)},
    "simple_push": {"adversary": (8, 5), "agent": (19, 5)},
    "simple_reference": {"agent": (21, 50)},
    "simple_speaker_listener": {"speaker": (3, 3), "listener": (11, 5)},
    "simple_spread": {"agent": (18, 5)},
    "simple_tag": {"adversary": (16, 5), "agent": (14, 5)},
    "simple_world_comm": {"leadadversary": (34, 20), "adversary": (34, 5), "agent": (28, 5)},
}


def test_every_mpe_task_is_listed():
    assert set(SPACES) == set(MPE_TASKS)


@pytest.mark.parametrize("task", list(MPE_TASKS))
def test_mappo_trains_and_evaluates_every_mpe_task(task):
    spec = EnvSpec(MPE_TASKS[task], max_cycles=6)
    layout = layout_of(spec)
    spaces = {n: (layout.team_obs_dim(t), layout.team_num_actions(t))
              for t, n in enumerate(layout.names)}
    assert spaces == SPACES[task]
    critic = "local" if task in ("simple_crypto", "simple_reference") else "central"  # IPPO too
    model = ModelSpec(critic=critic, hidden=(16, 16))
    run = train_inline(spec, iterations=2, num_envs=3, seed=0, model=model,
                       hp=MAPPOHyper(update_epochs=2, num_minibatches=2))
    last = run.history[-1]
    for name in layout.names:
        assert np.isfinite(last[f"return_mean/{name}"])
        assert np.isfinite(last[f"losses/policy_loss/{name}"])
    net = MAPPOModel(layout, model)
    net.load_state_dict(run.learner.weights())
    for t, name in enumerate(layout.names):  # each team's actor has its own widths
        first, last_layer = net.actors[t][0], net.actors[t][-1]
        assert (first.in_features, last_layer.out_features) == SPACES[task][name]
    obs = spec.make(4, seed=1).reset(seed=1)
    actions = MAPPOPolicy(net, deterministic=False)(obs)
    for t, agents in enumerate(layout.agents):  # every action inside its agent's own space
        assert int(actions[:, list(agents)].max()) < layout.team_num_actions(t)
    out = evaluate_teams(spec, model, run.learner.weights(), seed=0, episodes=4)
    assert out["eval_episodes"] == 4
    assert all(np.isfinite(out[f"eval_return_mean/{n}"]) for n in layout.names)
    if len(layout.names) > 1:
        assert all(f"eval_vs_random_return_se/{n}" in out for n in layout.names)


def test_random_speaker_draws_from_its_own_three_actions():
    spec = EnvSpec("simple_speaker_listener", max_cycles=4)
    layout = layout_of(spec)
    net = MAPPOModel(layout, ModelSpec())
    obs = torch.zeros(3000, layout.num_agents, layout.obs_dim)
    speaker = layout.team_index("speaker")
    actions, _ = net.act(obs, torch.Generator().manual_seed(0), True, frozenset({speaker}))
    counts = np.bincount(actions[:, 0].numpy(), minlength=3)
    assert len(counts) == 3 and counts.min() > 800  # uniform over 0..2, never 3 or 4
