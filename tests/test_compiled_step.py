"""A whole gradient step compiled (``--compile``) trains as the eager one does.

Each test steps an eager learner and a compiled one of the same seed on the same data and
asks for the same weights after several updates (an annealed learning rate, a resumed
optimiser), to float rounding: a compiled step that skipped the clip, took a stale learning
rate or lost the optimiser's moments would drift away within a few steps.
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
import torch

from daskrl.algos.compiled_step import compilable_adam
from daskrl.algos.dqn_learner import DQNHyper, DQNLearner
from daskrl.algos.learner import ActorCriticLearner
from daskrl.algos.offpolicy import adam, load_optimizer_state, optimizer_state
from daskrl.algos.ppo import PPOHyper

pytest.importorskip("torch._inductor")


def ppo_batch(n: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    return {"obs": rng.normal(size=(n, 4)).astype(np.float32),
            "actions": rng.integers(0, 2, n),
            "logp": np.full(n, -0.69, np.float32),
            "values": rng.normal(size=n).astype(np.float32),
            "advantages": (3 * rng.normal(size=n)).astype(np.float32),
            "returns": (3 * rng.normal(size=n)).astype(np.float32), "stats": {}}


def assert_same_weights(a: dict, b: dict, atol: float = 2e-5) -> None:
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=1e-4, atol=atol, msg=k)


def test_compiled_ppo_updates_match_the_eager_ones():
    hp = PPOHyper(update_epochs=2, num_minibatches=3)
    eager = ActorCriticLearner(4, 2, 0, (16, 16), hp)
    fast = ActorCriticLearner(4, 2, 0, (16, 16), hp, compile=True)
    assert eager.compile_s is None
    for i in range(4):  # the rate anneals: a compiled step must read the new one
        data, progress = ppo_batch(96, i), 0.2 * i
        m_eager, m_fast = eager.update([data], progress), fast.update([data], progress)
        for key, value in m_eager.items():
            assert m_fast[key] == pytest.approx(value, rel=1e-4, abs=1e-5), key
    assert_same_weights(eager.weights(), fast.weights())
    assert m_fast["charts/learning_rate"] == pytest.approx(2.5e-4 * 0.4)
    assert m_fast["compile_s"] > 0 and "compile_s" not in m_eager
    moved = ActorCriticLearner(4, 2, 0, (16, 16), hp).weights()
    assert any(not torch.allclose(moved[k], v) for k, v in fast.weights().items())


def test_compiled_halves_match_the_eager_ones():
    """Data-parallel replicas call compute_gradients and apply_gradients apart."""
    eager = ActorCriticLearner(4, 2, 0, (16, 16), PPOHyper())
    fast = ActorCriticLearner(4, 2, 0, (16, 16), PPOHyper(), compile=True)
    for i in range(3):
        plans = [learner.minibatches([ppo_batch(64, i)], 0.0) for learner in (eager, fast)]
        for mb_e, mb_f in zip(*plans, strict=True):
            (g1, p1), (g2, p2) = eager.compute_gradients(mb_e), fast.compute_gradients(mb_f)
            for a, b in zip(g1, g2, strict=True):
                torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-6)
            assert p2 == pytest.approx(p1, rel=1e-4, abs=1e-6)
            eager.apply_gradients(g1)
            fast.apply_gradients(g2)
        eager.finish_update([p1])
        fast.finish_update([p2])
    assert_same_weights(eager.weights(), fast.weights())


def test_a_resumed_compiled_learner_goes_on_as_the_eager_one():
    """An eager learner's state (fused Adam, float rate) loads into a compiled one, which
    keeps its own traceable Adam and continues where the eager one would."""
    hp = PPOHyper(num_minibatches=2)
    first = ActorCriticLearner(4, 2, 0, (16, 16), hp)
    first.update([ppo_batch(64, 0)], 0.0)
    state = first.state_dict()
    eager = ActorCriticLearner(4, 2, 1, (16, 16), hp)
    fast = ActorCriticLearner(4, 2, 1, (16, 16), hp, compile=True)
    for learner in (eager, fast):
        learner.load_state_dict(state)
        learner.update([ppo_batch(64, 1)], 0.5)
    group = fast.optimizer.param_groups[0]
    assert torch.is_tensor(group["lr"]) and not group["fused"] and group["foreach"] is False
    assert_same_weights(eager.weights(), fast.weights())
    saved = fast.state_dict()["optimizer"]["param_groups"][0]["lr"]
    assert isinstance(saved, float) and saved == pytest.approx(2.5e-4 * 0.5)


def test_load_optimizer_state_keeps_the_optimisers_own_kernel():
    net = torch.nn.Linear(3, 1)
    eager, fast = adam(net.parameters(), 1e-3), compilable_adam(net.parameters(), 5.0)
    load_optimizer_state(fast, optimizer_state(eager))
    assert float(fast.param_groups[0]["lr"]) == 1e-3 and fast.param_groups[0]["fused"] is None
    load_optimizer_state(eager, optimizer_state(fast))
    assert eager.param_groups[0]["fused"] and eager.param_groups[0]["lr"] == 1e-3


@pytest.mark.parametrize("prioritized", [False, True])
def test_compiled_dqn_steps_match_the_eager_ones(prioritized):
    hyper = dict(learning_starts=64, batch_size=32, train_frequency=1,
                 target_network_frequency=48, prioritized_replay=prioritized, anneal_lr=True)
    learners = [DQNLearner(4, 2, 0, (32, 32), DQNHyper(**hyper, compile=c)) for c in (False, True)]
    rng = np.random.default_rng(0)
    for i in range(3):
        n = 64
        batch = {"obs": rng.normal(size=(n, 4)).astype(np.float32),
                 "actions": rng.integers(0, 2, n), "rewards": rng.normal(size=n),
                 "next_obs": rng.normal(size=(n, 4)).astype(np.float32),
                 "discounts": np.full(n, 0.99), "stats": {"env_steps": n}}
        metrics = [learner.update([batch], 0.3 * i) for learner in learners]
    assert metrics[1]["gradient_steps"] == metrics[0]["gradient_steps"] > 0
    assert metrics[1]["compile_s"] > 0 and "compile_s" not in metrics[0]
    assert metrics[1]["losses/td_loss"] == pytest.approx(metrics[0]["losses/td_loss"], rel=1e-4)
    # Adam turns a rounding-sized gradient of a dead unit into a step of up to lr: 1e-4
    assert_same_weights(learners[0].weights(), learners[1].weights(), atol=1e-4)
    if prioritized:  # the same new priorities
        rows = np.arange(learners[0].replay.size)
        np.testing.assert_allclose(learners[1].replay.tree.leaves(rows),
                                   learners[0].replay.tree.leaves(rows), rtol=1e-3, atol=1e-4)


def metric_rows(out: Path) -> list[dict[str, str]]:
    with (out / "metrics.csv").open(newline="") as fh:
        return list(csv.DictReader(fh))


@pytest.mark.timeout(300)
def test_a_compiled_run_reports_its_compile_and_resumes_eager(tmp_path):
    """``--compile`` through the real path (a learner worker of the embedded cluster):
    ``compile_s`` reaches the metrics and the summary, and its checkpoint resumes eagerly."""
    import daskrl

    graph = str(Path(__file__).resolve().parent.parent / "graphs" / "ppo.py")
    tiny = {"num_actors": 1, "num_envs": 4, "num_steps": 32, "update_epochs": 2,
            "num_minibatches": 2, "eval_episodes": 2}
    out = tmp_path / "run"
    run = daskrl.train(graph, steps=256, out=out, progress=False, compile=True, **tiny)
    assert run.status == "finished" and run.summary["compile_s"] > 0
    assert all(float(r["compile_s"]) > 0 for r in metric_rows(out))
    resumed = daskrl.train(graph, steps=512, out=out, resume=True, progress=False,
                           compile=False, **tiny)
    assert resumed.status == "finished" and resumed.summary["iterations"] == 4
    assert [r["compile_s"] for r in metric_rows(out)[2:]] == ["", ""]  # eager: none compiled
    assert "compile_s" not in resumed.summary


def box_batch(n: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    return {"obs": rng.normal(size=(n, 3)).astype(np.float32),
            "actions": rng.uniform(-2, 2, (n, 1)).astype(np.float32),
            "rewards": rng.normal(size=n), "discounts": np.full(n, 0.99),
            "next_obs": rng.normal(size=(n, 3)).astype(np.float32), "stats": {"env_steps": n}}


@pytest.mark.parametrize("algo", ["sac", "td3"])
def test_compiled_box_steps_match_the_eager_ones_and_resume(algo):
    """SAC (critics, actor and temperature) and TD3 (critics, delayed actor): the compiled
    steps draw the same noise and end at the same weights; an eager learner's state (fused
    Adam, three optimisers for SAC) resumes in a compiled one and both go on alike."""
    from daskrl.algos.sac import SACHyper, SACLearner
    from daskrl.algos.td3 import TD3Hyper, TD3Learner

    cls, hyper = {"sac": (SACLearner, SACHyper), "td3": (TD3Learner, TD3Hyper)}[algo]
    low, high = np.array([-2.0]), np.array([2.0])

    def learner(compiled: bool):
        return cls(3, low, high, 0, (32, 32), hyper(learning_starts=32, batch_size=16,
                                                     compile=compiled))

    eager, fast = learner(False), learner(True)
    for i in range(2):
        data = box_batch(24, i)
        m_eager, m_fast = eager.update([data], 0.5 * i), fast.update([data], 0.5 * i)
    assert m_fast["gradient_steps"] == m_eager["gradient_steps"] > 0
    assert m_fast["compile_s"] > 0 and "compile_s" not in m_eager
    for key in [k for k in m_eager if k.startswith("losses/")]:
        assert m_fast[key] == pytest.approx(m_eager[key], rel=1e-4, abs=1e-5), key
    assert_same_weights(eager.weights(), fast.weights(), atol=1e-4)
    assert_same_weights(eager.model_state()["qf"], fast.model_state()["qf"], atol=1e-4)
    resumed = learner(True)
    resumed.load_state_dict(eager.state_dict())
    data = box_batch(16, 9)
    eager.update([data], 0.9)
    resumed.update([data], 0.9)
    assert_same_weights(eager.weights(), resumed.weights(), atol=1e-4)


@pytest.mark.parametrize("graph", ["sac", "td3"])
def test_the_graphs_compile_flag_reaches_the_learner(graph):
    from daskrl.core.script import load_graph

    module = load_graph(str(Path(__file__).resolve().parent.parent / "graphs" / f"{graph}.py"))
    assert module.Config(compile=True).hyper().compile is True
    assert module.Config().hyper().compile is False
