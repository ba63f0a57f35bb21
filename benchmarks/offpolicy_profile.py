"""Where an off-policy iteration's time goes: daskrl's DQN / SAC learner and actor against
Stable-Baselines3's, same settings, in one process, interleaved.

Per gradient step: one iteration's update (DQN: 128 steps of batch 64 after 256 env steps;
SAC: 100 steps of batch 256 after 100 env steps) of each system, alternating, replays
holding 20k transitions; also a bare step: the arithmetic no implementation can skip, with
plain torch modules and fused Adam, nothing else (DQN: forward, Huber loss, backward and the
target's forward; SAC, CleanRL's maths: the target actor and twin target critics, the twin
critics' loss, the actor's loss with its own sample, the temperature's loss with another,
three backward passes and Adam steps, Polyak; once with two critic modules, once with the
critics stacked, :class:`daskrl.algos.ensemble.StackedMLP`). Per env step: a rollout of
each system's actor (DQN: 4 envs, SAC: 1 env). One torch thread, as a worker; times are the
process's CPU seconds (on a shared machine wall time also counts other processes' turns).
*daskrl --compile* is the same learner with each whole gradient step compiled
(``torch.compile``, warmed up before the clock starts). Then cProfile of one iteration
of each, split into time inside torch's C++ calls (kernels and autograd), numpy, and
the Python around them (cProfile inflates the Python share).

    python benchmarks/offpolicy_profile.py --algo dqn      # results/dqn_profile.json
    python benchmarks/offpolicy_profile.py --algo sac      # results/sac_profile.json
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from _common import ROOT, load_average, machine_info, markdown_table, median, write_json

sys.path.insert(0, str(ROOT))  # daskrl from this checkout


def _per(fn: Callable[[], int]) -> float:
    """Seconds per unit of ``fn`` (which returns how many units it did)."""
    t = time.process_time()
    n = fn()
    return (time.process_time() - t) / max(1, n)


def _ops(fn: Callable[[], int]) -> float:
    """``aten`` ops (torch's kernels and views) per unit of ``fn``, counted by torch's profiler:
    a measure of the fixed per-call cost that does not move with the machine's load."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        n = fn()
    return sum(e.count for e in prof.key_averages() if e.key.startswith("aten::")) / max(1, n)


def _split(fn: Callable[[], Any]) -> dict[str, float]:
    """cProfile ``fn`` once: shares of its time in torch's C++ calls, numpy and Python."""
    prof = cProfile.Profile()
    prof.enable()
    fn()
    prof.disable()
    stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]
    parts = {"torch C++": 0.0, "numpy": 0.0, "python": 0.0}
    for (file, _, name), (_, _, tottime, _, _) in stats.items():
        if file == "~" and "torch" in name:
            parts["torch C++"] += tottime
        elif file == "~" and ("numpy" in name or "ufunc" in name):
            parts["numpy"] += tottime
        else:
            parts["python"] += tottime
    total = sum(parts.values())
    return {k: v / total for k, v in parts.items()}


def _sb3_act(model: Any, steps: int) -> int:
    """``steps`` env steps of SB3's own loop acting with its policy (past learning_starts),
    without gradient steps."""
    model.learning_starts, model.gradient_steps = 0, 0
    model.learn(steps, reset_num_timesteps=False)
    model.learning_starts, model.gradient_steps = 10 ** 9, 1
    return steps


def dqn_systems(double_q: bool, fill: int) -> dict[str, dict[str, Callable[[], int]]]:
    """Per system: ``update`` (returns gradient steps) and ``act`` (returns env steps)."""
    from stable_baselines3 import DQN
    from stable_baselines3.common.env_util import make_vec_env

    from daskrl.algos.dqn_learner import DQNHyper, DQNLearner
    from daskrl.algos.q_actor import QActor

    learner = DQNLearner(4, 2, 1, (256, 256), DQNHyper(learning_starts=0, double_q=double_q))
    compiled = DQNLearner(4, 2, 1, (256, 256),
                          DQNHyper(learning_starts=0, double_q=double_q, compile=True))
    actor = QActor("CartPole-v1", 4, 1, (256, 256))
    for _ in range(fill // 256):
        rollout = actor.rollout(64)
        learner.replay.add(rollout)
        compiled.replay.add(rollout)
    batch = actor.rollout(64)
    batch["stats"]["env_steps"] = 256  # one iteration's worth: 128 gradient steps

    model = DQN("MlpPolicy", make_vec_env("CartPole-v1", n_envs=4, seed=1),
                learning_rate=2.3e-3, batch_size=64, buffer_size=100_000,
                learning_starts=10 ** 9, gamma=0.99, target_update_interval=10, train_freq=64,
                gradient_steps=128, exploration_fraction=0.16, exploration_final_eps=0.04,
                policy_kwargs={"net_arch": [256, 256]}, seed=1, device="cpu")
    model.learn(fill)
    model.exploration_schedule = lambda _: 0.04  # as late in a run: most steps use the net

    def sb3_update() -> int:
        model.train(gradient_steps=128, batch_size=64)
        return 128

    def sb3_act() -> int:
        return _sb3_act(model, 256)

    net = torch.nn.Sequential(torch.nn.Linear(4, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256),
                              torch.nn.ReLU(), torch.nn.Linear(256, 2))
    target = torch.nn.Sequential(*[torch.nn.Linear(m.in_features, m.out_features)
                                   if isinstance(m, torch.nn.Linear) else m for m in net])
    opt = torch.optim.Adam(net.parameters(), lr=2.3e-3, fused=True)
    x, nxt = torch.randn(128, 64, 4), torch.randn(128 * 64, 4)
    a, r = torch.randint(0, 2, (128, 64, 1)), torch.randn(128, 64)

    def bare() -> int:
        with torch.no_grad():
            tq = target(nxt).max(1).values.reshape(128, 64)
        for i in range(128):
            q = net(x[i]).gather(1, a[i]).squeeze(1)
            loss = F.smooth_l1_loss(q, r[i] + 0.99 * tq[i])
            opt.zero_grad()
            loss.backward()
            opt.step()
        return 128

    return {"daskrl": {"update": lambda: learner.update([batch], 0.5)["gradient_steps"],
                       "act": lambda: actor.rollout(64)["stats"]["rollout_steps"] * 4},
            "daskrl --compile": {
                "update": lambda: compiled.update([batch], 0.5)["gradient_steps"]},
            "sb3": {"update": sb3_update, "act": sb3_act},
            "bare step": {"update": bare}}


def sac_systems(fill: int) -> dict[str, dict[str, Callable[[], int]]]:
    """Per system: ``update`` (returns gradient steps) and ``act`` (returns env steps)."""
    from stable_baselines3 import SAC

    from daskrl.algos.sac import SACActor, SACHyper, SACLearner

    low, high = np.array([-2.0], np.float32), np.array([2.0], np.float32)
    learner = SACLearner(3, low, high, 1, (256, 256), SACHyper())
    compiled = SACLearner(3, low, high, 1, (256, 256), SACHyper(compile=True))
    actor = SACActor("Pendulum-v1", 1, 1, (256, 256))
    first = actor.rollout(fill)
    first["stats"]["env_steps"] = 0
    learner.update([first], 0.0)
    compiled.update([first], 0.0)
    batch = actor.rollout(100)
    batch["stats"]["env_steps"] = 100

    model = SAC("MlpPolicy", "Pendulum-v1", learning_rate=1e-3, seed=1, device="cpu",
                learning_starts=10 ** 9)
    model.learn(fill)

    def sb3_update() -> int:
        model.train(gradient_steps=100, batch_size=256)
        return 100

    def sb3_act() -> int:
        return _sb3_act(model, 200)

    def act() -> int:
        learner.actor.explore.fill_(0.0)
        actor.set_weights(learner.weights(), actor.version + 1)
        return actor.rollout(200)["stats"]["rollout_steps"]

    return {"daskrl": {"update": lambda: learner.update([batch], 0.5)["gradient_steps"],
                       "act": act},
            "daskrl --compile": {
                "update": lambda: compiled.update([batch], 0.5)["gradient_steps"]},
            "sb3": {"update": sb3_update, "act": sb3_act},
            "bare step, two critic modules": {"update": sac_bare(stacked=False)},
            "bare step, critics stacked": {"update": sac_bare(stacked=True)}}


def sac_bare(stacked: bool, steps: int = 100, batch: int = 256) -> Callable[[], int]:
    """``steps`` bare SAC gradient steps (see the module notes) on random minibatches."""
    import math

    from daskrl.algos.ensemble import StackedMLP

    def mlp(n_in: int, n_out: int) -> torch.nn.Sequential:
        return torch.nn.Sequential(torch.nn.Linear(n_in, 256), torch.nn.ReLU(),
                                   torch.nn.Linear(256, 256), torch.nn.ReLU(),
                                   torch.nn.Linear(256, n_out))

    torch.manual_seed(0)
    actor = mlp(3, 2)
    members = [mlp(4, 1), mlp(4, 1)]
    if stacked:
        critic = StackedMLP(members)
        target = StackedMLP(members)

        def twin(net: Any, x: torch.Tensor) -> torch.Tensor:
            return net(x).squeeze(-1)
    else:
        critic = torch.nn.ModuleList(members)
        target = torch.nn.ModuleList([mlp(4, 1), mlp(4, 1)])
        target.load_state_dict(critic.state_dict())

        def twin(net: Any, x: torch.Tensor) -> torch.Tensor:
            return torch.stack([net[0](x).squeeze(-1), net[1](x).squeeze(-1)])

    q_params, t_params = list(critic.parameters()), list(target.parameters())
    a_params = list(actor.parameters())
    log_alpha = torch.zeros(1, requires_grad=True)
    q_opt = torch.optim.Adam(q_params, 1e-3, fused=True)
    a_opt = torch.optim.Adam(a_params, 1e-3, fused=True)
    alpha_opt = torch.optim.Adam([log_alpha], 1e-3, fused=True)
    obs, nxt = torch.randn(steps, batch, 3), torch.randn(steps, batch, 3)
    act, rew = torch.rand(steps, batch, 1) * 4 - 2, torch.randn(steps, batch)

    def sample(o: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mean, log_std = actor(o).chunk(2, -1)
        log_std = -5 + 3.5 * (torch.tanh(log_std) + 1)
        std = log_std.exp()
        x = mean + std * torch.randn_like(mean)
        y = torch.tanh(x)
        logp = (-0.5 * ((x - mean) / std) ** 2 - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
        return 2 * y, logp - torch.log(2 * (1 - y.pow(2)) + 1e-6).sum(-1)

    def run() -> int:
        for i in range(steps):
            alpha = log_alpha.exp().detach()
            with torch.no_grad():
                next_act, next_logp = sample(nxt[i])
                smaller = twin(target, torch.cat([nxt[i], next_act], -1)).amin(0)
                y = rew[i] + 0.99 * (smaller - alpha * next_logp)
            q = twin(critic, torch.cat([obs[i], act[i]], -1))
            loss = F.mse_loss(q[0], y) + F.mse_loss(q[1], y)
            q_opt.zero_grad()
            loss.backward()
            q_opt.step()
            pi, logp = sample(obs[i])
            actor_loss = (alpha * logp - twin(critic, torch.cat([obs[i], pi], -1)).amin(0))
            a_opt.zero_grad()
            torch.autograd.backward(actor_loss.mean(), inputs=a_params)
            a_opt.step()
            with torch.no_grad():
                _, logp = sample(obs[i])
            alpha_opt.zero_grad()
            (-log_alpha.exp() * (logp - 1.0)).mean().backward()
            alpha_opt.step()
            with torch.no_grad():
                torch._foreach_lerp_(t_params, q_params, 0.005)
        return steps

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algo", choices=["dqn", "sac"], default="dqn")
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--double-q", action="store_true", help="daskrl's DQN with double Q")
    parser.add_argument("--fill", type=int, default=20_000, help="transitions in the replays")
    args = parser.parse_args()
    torch.set_num_threads(1)
    load_before = load_average()
    systems = (dqn_systems(args.double_q, args.fill) if args.algo == "dqn"
               else sac_systems(args.fill))
    for parts in systems.values():  # warm up
        for fn in parts.values():
            fn()
    times: dict[str, dict[str, list[float]]] = {
        name: {k: [] for k in parts} for name, parts in systems.items()}
    for _ in range(args.reps):
        for name, parts in systems.items():
            for kind, fn in parts.items():
                times[name][kind].append(_per(fn))
    shares = {name: _split(parts["update"]) for name, parts in systems.items()
              if not name.startswith("bare step")}
    ops = {name: _ops(parts["update"]) for name, parts in systems.items()}
    med = {name: {k: median(v) for k, v in kinds.items()} for name, kinds in times.items()}
    load_after = load_average()
    rows = []
    for name, m in med.items():
        share = shares.get(name)
        rows.append([name, f"{m['update'] * 1e3:.3f}", f"{m['update'] / med['sb3']['update']:.2f}",
                     f"{m['act'] * 1e3:.3f}" if "act" in m else "-", f"{ops[name]:.0f}",
                     f"{share['torch C++']:.0%} / {share['numpy']:.0%} / {share['python']:.0%}"
                     if share else "-"])
    table = markdown_table(["system", "CPU ms per gradient step (median)", "x SB3's time",
                            "CPU ms per env step acting (median)", "aten ops per gradient step",
                            "update under cProfile: torch C++ / numpy / Python"], rows)
    print(table)
    loads = f"{load_before['load_1m']:.1f} -> {load_after['load_1m']:.1f}"
    print(f"load {loads}")
    command = (f"python benchmarks/offpolicy_profile.py --algo {args.algo} --reps {args.reps} "
               f"--fill {args.fill}" + (" --double-q" if args.double_q else ""))
    write_json(ROOT / f"benchmarks/results/{args.algo}_profile.json", {
        "times_s": times, "medians_s": med, "cprofile_shares": shares, "table": table,
        "aten_ops_per_step": ops,
        "command": command,
        "load": {"before": load_before, "after": load_after}, "machine": machine_info(),
        "settings": vars(args)})


if __name__ == "__main__":
    main()
