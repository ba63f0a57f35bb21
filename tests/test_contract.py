"""The distribution/algorithm contract: every distribution declares every member, refuses
what it cannot serve in one line before the run takes a cluster, and is an object of one run.

MAPPO (``graphs/mappo.py``) is the case that the contract has to settle: under each
distribution it either trains or is refused at once by the CLI.
"""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from daskrl import Algorithm
from daskrl.core.algorithm import (
    CAPABILITIES,
    EnvPart,
    GradientActor,
    InferencePart,
    LearnerOutput,
    SplitActor,
)
from daskrl.core.placement import Placement
from daskrl.core.script import load_graph
from daskrl.distributions import KINDS, NAMES, Distribution, Unsupported, get_distribution
from daskrl.distributions.base import IterationInputs, iterations_per_task

ROOT = Path(__file__).resolve().parents[1]
MAPPO = ROOT / "graphs" / "mappo.py"

MEMBERS = ("name", "requires", "dynamic", "required", "check", "fragments", "iteration",
           "check_placement", "iterations_per_task", "workers_wanted", "sketch")
"""Every member of :class:`Distribution`: what the driver, CLI and renderer may call."""

SERVES = {"actors-learner": True, "single": True, "data-parallel": True,
          "central-inference": False, "async": False, "impala": False, "apex": False}
"""Whether each distribution serves MAPPO (its actor is neither split nor a gradient actor,
nor records V-trace sequences)."""


def _learner(seed: int, device: str) -> Any:
    from daskrl.algos.learner import ActorCriticLearner

    return ActorCriticLearner(4, 2, seed, device=device)


def _algo(caps: frozenset[str] | set[str] = frozenset(), num_actors: int = 2) -> Algorithm:
    # a real learner: data-parallel's check asks it for its update plan
    return Algorithm("probe", print, _learner, print, num_steps=4, num_envs=2,
                     num_actors=num_actors, capabilities=caps)


def _protocol_members(proto: type) -> set[str]:
    """The members a Protocol declares itself (methods and annotated attributes)."""
    own = {n for n, v in vars(proto).items() if not n.startswith("_") and callable(v)}
    return own | set(getattr(proto, "__annotations__", {}))


def test_the_interface_declares_every_member():
    declared = {n for n in dir(Distribution) if not n.startswith("_")}
    assert set(MEMBERS) <= declared | {"name"}
    assert Distribution.__abstractmethods__ == frozenset({"fragments", "iteration"})
    with pytest.raises(TypeError):
        Distribution()  # type: ignore[abstract]


@pytest.mark.parametrize("name", NAMES)
def test_every_distribution_implements_every_member(name):
    cls = KINDS[name]
    assert issubclass(cls, Distribution) and not inspect.isabstract(cls)
    dist = get_distribution(name)
    assert dist.name == name and isinstance(dist.dynamic, bool)
    assert isinstance(dist.requires, frozenset) and dist.requires <= set(CAPABILITIES)
    for member in MEMBERS[3:]:
        assert callable(getattr(dist, member)), member
    algo = _algo(CAPABILITIES.keys())
    assert set(dist.required(algo)) <= set(CAPABILITIES)
    assert dist.requires <= set(dist.required(algo))
    dist.check(algo)  # an algorithm that offers everything is served
    assert dist.workers_wanted(algo) >= 1
    fragments = dist.fragments(algo)
    assert fragments and {f.role for f in fragments} <= {
        "rollout", "learner", "inference", "env", "replica", "replay"}
    inputs = IterationInputs(algo, Placement({}, {}), "r", 1, 0, 10, None)
    assert iterations_per_task(dist, inputs) >= 1
    assert dist.check_placement(Placement({}, {"replica": ("a", "b")}), algo) is None


@pytest.mark.parametrize("name", NAMES)
def test_refusals_are_one_line_naming_the_capability(name):
    dist = get_distribution(name)
    needed = dist.required(_algo())
    if not needed:
        dist.check(_algo())  # needs nothing: serves anything
        return
    with pytest.raises(Unsupported) as info:
        dist.check(_algo())
    text = str(info.value)
    assert "\n" not in text and isinstance(info.value, ValueError)
    missing = [cap for cap in needed if f"{cap!r} capability" in text]
    assert len(missing) == 1, text
    assert f"the {name!r} distribution" in text and "'probe'" in text
    # declaring that one capability moves the refusal on to the next, or passes
    caps = set(missing)
    while needed.keys() - caps:
        with pytest.raises(Unsupported, match="capability"):
            dist.check(_algo(caps))
        caps = set(needed)
    dist.check(_algo(caps))


def test_conditions_of_each_distribution():
    # single fuses its replicas into one actor: only several replicas need resized()
    single = get_distribution("single")
    single.check(_algo(num_actors=1))
    with pytest.raises(Unsupported, match="'resizable-actor'.*--num-actors 1"):
        single.check(_algo(num_actors=2))
    # async needs two actors even when the actor computes gradients
    with pytest.raises(Unsupported, match=">= 2 actors"):
        get_distribution("async").check(_algo({"gradient-actor"}, num_actors=1))
    # actors-learner serves any actor: it fuses co-located replicas only when resizable
    get_distribution("actors-learner").check(_algo())


def test_algorithm_capabilities_come_from_the_vocabulary():
    assert _algo({"gradients"}).capabilities == frozenset({"gradients"})
    with pytest.raises(ValueError, match=r"unknown capabilities \['telepathy'\]"):
        _algo({"telepathy"})
    with pytest.raises(TypeError, match="collection of names"):
        _algo("gradients")  # type: ignore[arg-type]
    assert _algo().distribution == "actors-learner"


def test_get_distribution_returns_a_new_instance_per_call():
    for name in NAMES:
        assert get_distribution(name) is not get_distribution(name)
    one, two = (get_distribution("actors-learner:stale=1") for _ in range(2))
    algo = _algo({"resizable-actor"})
    out = LearnerOutput(0, {}, {})
    inputs = IterationInputs(algo, Placement({}, {}), "run", 1, 0, 10, out)
    one.acting_weights(inputs)  # the run state of `one` only
    assert one.last_built == ("run", 1, out) and two.last_built is None


def test_vec_env_actor_is_a_split_actor_and_gradient_actor_a_gradient_actor():
    from daskrl.algos.a2c import A2CActor as A3CActor
    from daskrl.algos.actor_critic import VecEnvActor

    actor = VecEnvActor("CartPole-v1", num_envs=2, seed=0)
    for name in _protocol_members(SplitActor) | {"resized", "set_weights", "rollout"}:
        assert callable(getattr(actor, name)), name
    env, policy = actor.env_part(), actor.inference_part()
    for name in _protocol_members(EnvPart):
        assert hasattr(env, name), name
    for name in _protocol_members(InferencePart):
        assert callable(getattr(policy, name)), name
    policy.begin(2, env.obs)
    for _ in range(2):
        policy.record(env.step(policy.act(env.obs)))
    assert policy.finish(env.obs)["stats"]["rollout_steps"] == 2
    grad_actor = A3CActor("CartPole-v1", num_envs=2, seed=0, rollout_steps=4)
    assert grad_actor.rollout_steps == 4
    for name in _protocol_members(GradientActor):
        assert hasattr(grad_actor, name), name


def test_the_graphs_declare_what_they_offer():
    ppo = load_graph(str(ROOT / "graphs" / "ppo.py"))
    a3c = load_graph(str(ROOT / "graphs" / "a3c.py"))
    mappo = load_graph(str(MAPPO))
    algos = {"ppo": ppo.build(ppo.Config()), "a3c": a3c.build(a3c.Config()),
             "mappo": mappo.build(mappo.Config(num_envs=4, num_steps=5))}
    served = {g: {n for n in NAMES if _serves(n, a)} for g, a in algos.items()}
    assert served["ppo"] == set(NAMES) - {"async", "impala", "apex"}  # impala: with --vtrace
    assert served["a3c"] == set(NAMES) - {"impala", "apex"}
    vtrace_ppo = ppo.build(ppo.Config(vtrace=True))
    assert {n for n in NAMES if _serves(n, vtrace_ppo)} == set(NAMES) - {
        "async", "central-inference", "apex"}
    assert served["mappo"] == {n for n, ok in SERVES.items() if ok}
    assert algos["a3c"].distribution == "async"
    assert algos["ppo"].distribution == algos["mappo"].distribution == "actors-learner"


def _serves(name: str, algo: Algorithm) -> bool:
    try:
        get_distribution(name).check(algo)
    except Unsupported:
        return False
    return True


def _cli(tmp_path: Path, *args: str, timeout: float = 300) -> tuple[int, str, str]:
    proc = subprocess.run([sys.executable, "-m", "daskrl.cli", "train", *args],
                          cwd=tmp_path, capture_output=True, text=True, timeout=timeout)
    return proc.returncode, proc.stdout, proc.stderr


@pytest.mark.parametrize("name", [n for n, ok in SERVES.items() if not ok])
def test_mappo_is_refused_at_once_by_the_cli(tmp_path, name):
    """The embedded cluster's path (no --scheduler), whose first worker starts while the
    graph loads: the refusal comes from the checks, before the run takes that cluster (the
    ``scheduler:`` line the CLI prints as it does) and before anything is written."""
    rc, out, err = _cli(tmp_path, str(MAPPO), "--distribution", name, "--steps", "100",
                        "--num-envs", "4", "--num-steps", "5", "--out", "run", timeout=120)
    assert rc == 2, err
    lines = err.splitlines()
    ours = [line for line in lines if line.startswith("daskrl:")]  # workers may warn too
    assert len(ours) == 1 and ours[0].startswith("daskrl: error: "), err
    assert "capability" in ours[0] and f"{name!r}" in ours[0] and "Traceback" not in err
    assert not [line for line in lines if line.startswith(("scheduler:", "dashboard:"))], err
    assert out == "" and not (tmp_path / "run").exists()


@pytest.mark.parametrize("name", [n for n, ok in SERVES.items() if ok])
def test_mappo_trains_under_the_cli(tmp_path, name):
    rc, out, err = _cli(tmp_path, str(MAPPO), "--distribution", name, "--scheduler", "sync",
                        "--steps", "80", "--num-envs", "4", "--num-steps", "5",
                        "--num-actors", "2", "--update-epochs", "1", "--eval-episodes", "2",
                        "--out", "run", "--no-progress")
    assert rc == 0, err
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["distribution"] == name and summary["env_steps"] >= 80
    assert "eval_return_mean/adversary" in summary


def test_a3c_runs_async_without_a_distribution_flag(tmp_path):
    rc, _, err = _cli(tmp_path, str(ROOT / "graphs" / "a3c.py"), "--scheduler", "sync",
                      "--steps", "64", "--num-envs", "2", "--rollout-steps", "4",
                      "--num-steps", "16", "--eval-episodes", "1", "--out", "run",
                      "--no-progress")
    assert rc == 0, err
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["distribution"] == "async"
    rows = (tmp_path / "run" / "metrics.csv").read_text().splitlines()
    header = rows[0].split(",")
    assert int(rows[1].split(",")[header.index("grads_applied")]) == 2 * 16 // 4


def test_data_parallel_refuses_a_plan_its_replicas_could_leave_apart():
    """PPO with ``target_kl`` may stop its epochs early on one replica and not on another:
    data-parallel refuses it in ``check``, before anything is placed."""
    from daskrl.algos.actor_critic import VecEnvActor
    from daskrl.algos.learner import ActorCriticLearner
    from daskrl.algos.ppo import PPOHyper

    def make_learner(seed: int, device: str) -> ActorCriticLearner:
        return ActorCriticLearner(4, 2, seed, hp=PPOHyper(target_kl=0.01), device=device)

    algo = Algorithm("ppo-kl", lambda seed: VecEnvActor("CartPole-v1", 2, seed), make_learner,
                     print, num_steps=8, num_envs=2, capabilities={"gradients"})
    with pytest.raises(Unsupported, match="data-parallel.*target_kl") as info:
        get_distribution("data-parallel").check(algo)
    assert "\n" not in str(info.value)
    get_distribution("actors-learner").check(algo)  # early stopping is fine on one learner
