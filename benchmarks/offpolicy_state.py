"""What an off-policy learner output costs under ``actors-learner``: the full state (the
replay's contents copied, then pickled for the driver) against the light state that outputs
between checkpoints carry (networks, optimiser, counters).

One DQN learner of ``graphs/dqn.py`` with its defaults (CartPole-v1, two ReLU layers of 256,
an iteration of 256 env steps and 128 gradient steps) holds ``--fill`` transitions; each
repetition runs the learner task's function (:func:`daskrl.core.roles.learn`) on one
iteration's batch, once asking for the full state (what every update returned before) and
once for the light one, alternating, and pickles each output as Dask does to send it to the
driver. One torch thread, as a worker; times are the process's CPU seconds (a shared,
loaded machine stretches wall time, not CPU time, by other processes' work). Medians over
``--reps``.

    python benchmarks/offpolicy_state.py             # results/offpolicy_state.json, .md
"""

from __future__ import annotations

import argparse
import dataclasses
import pickle
import sys
import time
from typing import Any

import numpy as np
import torch
from _common import ROOT, load_average, machine_info, markdown_table, median, write_json

sys.path.insert(0, str(ROOT))  # daskrl from this checkout


READING = """Reading: making and pickling the full state grows with the replay's bytes (CPU
ms above, plus sending it: to the driver, and to every rollout worker, which takes the
learner output as its input); the light state does not. For CartPole at 100k transitions
it is a few ms next to an update of 128 gradient steps (the learn rows differ by less than
their run-to-run noise under this load); at SAC's default capacity of 1M it is tens of MiB
per update. Outputs between checkpoints no longer carry it; a learner rebuilt from one (its
worker lost) restarts its replay empty and reports ``replay_lost``.
"""


def _code() -> str:
    info = machine_info()
    dirty = " with uncommitted changes" if info.get("git_dirty") else ""
    return f"code at {info.get('git_commit', '?')}{dirty}"


def state_costs(learner: Any, reps: int) -> dict[str, dict[str, float]]:
    """CPU seconds to make the full and the light state and to pickle each (in a learner
    output, as Dask sends it), and its bytes (medians, alternating)."""
    from daskrl.core.algorithm import LearnerOutput

    weights = learner.weights()
    out: dict[str, dict[str, list[float]]] = {
        m: {"state_s": [], "pickle_s": [], "bytes": []} for m in ("full", "light")}
    for _ in range(reps):
        for mode, fn in (("full", learner.state_dict), ("light", learner.light_state_dict)):
            t0 = time.process_time()
            state = fn()
            t1 = time.process_time()
            blob = pickle.dumps(LearnerOutput(1, state, weights), protocol=5)
            out[mode]["pickle_s"].append(time.process_time() - t1)
            out[mode]["state_s"].append(t1 - t0)
            out[mode]["bytes"].append(len(blob))
    return {m: {k: float(median(v)) for k, v in parts.items()} for m, parts in out.items()}


def graph_learner(name: str, fill: int) -> Any:
    """The learner of ``graphs/NAME.py`` (defaults) with ``fill`` transitions of its actor's
    shapes (values from a few real rollouts, repeated: the bytes are what count)."""
    from daskrl.core.script import load_graph

    graph = load_graph(str(ROOT / "graphs" / f"{name}.py"))
    algo = graph.build(graph.Config())
    learner = algo.make_learner(1, "cpu")
    batch = {k: v for k, v in algo.make_actor(1).rollout(algo.num_steps).items()
             if k != "stats"}
    rows = len(batch["rewards"])
    reps = -(-fill // rows)
    big = {k: np.concatenate([v] * reps)[:fill] for k, v in batch.items()}
    learner.replay.add(big)
    return learner


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fill", type=int, default=100_000, help="transitions in the replay")
    parser.add_argument("--sac-fill", type=int, default=1_000_000,
                        help="transitions in SAC's replay (its default capacity)")
    parser.add_argument("--reps", type=int, default=9)
    args = parser.parse_args()
    torch.set_num_threads(1)
    from daskrl.core import roles
    from daskrl.core.algorithm import LearnerOutput
    from daskrl.core.script import load_graph

    graph = load_graph(str(ROOT / "graphs" / "dqn.py"))
    algo = graph.build(graph.Config(learning_starts=0))
    actor = algo.make_actor(1)
    ctx = roles.TaskContext("state-bench", 1, 0, 0, 1000)
    first = algo.make_learner(ctx.replica_seed(), "cpu")
    learner_in = LearnerOutput(0, first.state_dict(), first.weights())
    holder, _ = roles.resident_learner(ctx, algo, learner_in)
    while len(holder["learner"].replay) < args.fill:  # fill without gradient steps
        batch = actor.rollout(algo.num_steps)
        holder["learner"].replay.add(batch)
    load_before = load_average()
    times: dict[str, dict[str, list[float]]] = {
        mode: {"learn_s": [], "pickle_s": [], "bytes": []} for mode in ("full", "light")}
    for rep in range(args.reps + 1):  # the first round warms up
        for mode in ("full", "light"):
            batch = roles.rollout(dataclasses.replace(ctx, iteration=learner_in.version), algo,
                                  learner_in, algo.num_steps)
            c = dataclasses.replace(ctx, iteration=learner_in.version,
                                    output_state=mode)  # type: ignore[arg-type]
            t0 = time.process_time()
            out = roles.learn(c, algo, learner_in, batch)
            t1 = time.process_time()
            blob = pickle.dumps(out, protocol=5)
            t2 = time.process_time()
            learner_in = out
            if rep:
                times[mode]["learn_s"].append(t1 - t0)
                times[mode]["pickle_s"].append(t2 - t1)
                times[mode]["bytes"].append(len(blob))
    states = state_costs(holder["learner"], args.reps)
    sac = graph_learner("sac", args.sac_fill)
    states_sac = state_costs(sac, args.reps)
    load_after = load_average()
    med = {mode: {k: median(v) for k, v in parts.items()} for mode, parts in times.items()}
    rows = [[f"{mode} state" + (" (every update before)" if mode == "full" else ""),
             f"{m['learn_s'] * 1e3:.1f}", f"{m['pickle_s'] * 1e3:.1f}",
             f"{(m['learn_s'] + m['pickle_s']) * 1e3:.1f}", f"{m['bytes'] / 2 ** 20:.1f}"]
            for mode, m in med.items()]
    table = markdown_table(["output", "CPU ms in learn (median)", "CPU ms to pickle the output",
                            "CPU ms per update in all", "MiB sent to the driver"], rows)
    state_rows = [[f"{name}, {n:,} transitions", mode, f"{m['state_s'] * 1e3:.1f}",
                   f"{m['pickle_s'] * 1e3:.1f}", f"{m['bytes'] / 2 ** 20:.1f}"]
                  for name, n, costs in (("DQN CartPole-v1", args.fill, states),
                                         ("SAC Pendulum-v1", args.sac_fill, states_sac))
                  for mode, m in costs.items()]
    state_table = markdown_table(["learner", "state", "CPU ms to make it (median)",
                                  "CPU ms to pickle the output", "MiB"], state_rows)
    print(state_table)
    command = (f"python benchmarks/offpolicy_state.py --fill {args.fill} --sac-fill "
               f"{args.sac_fill} --reps {args.reps}")
    loads = f"{load_before['load_1m']:.1f} -> {load_after['load_1m']:.1f}"
    print(table)
    print(f"load {loads}")
    (ROOT / "benchmarks/offpolicy_state.md").write_text(
        "# What an off-policy learner's output costs under actors-learner\n\n"
        f"`{command}` (1-minute load {loads} on 2 shared CPUs; {_code()}; CPU time of one\n"
        "process with one torch thread, medians). Each update's output used to carry the\n"
        "learner's full state, the replay's contents included; now only a checkpointed (or\n"
        "deterministic) iteration's does, the others carry the light state (networks,\n"
        "optimisers, counters).\n\n"
        f"## The state alone\n\n{state_table}\n\n"
        f"## One DQN update (128 gradient steps) with its output\n\n{table}\n\n"
        + READING)
    write_json(ROOT / "benchmarks/results/offpolicy_state.json", {
        "times_s": times, "medians": med, "table": table, "command": command,
        "state_costs": {"dqn": states, "sac": states_sac}, "state_table": state_table,
        "replay_size": len(holder["learner"].replay),
        "load": {"before": load_before, "after": load_after}, "machine": machine_info(),
        "settings": vars(args)})


if __name__ == "__main__":
    main()
