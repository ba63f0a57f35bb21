"""PPO CartPole benchmark: medians, ratios, targets and the README section."""

from __future__ import annotations

import math
import shlex
from typing import Any

from _common import (
    fmt,
    markdown_table,
    median,
    ratio,
)
from _ppo_setup import LABELS, SYSTEMS

# ----------------------------------------------------------------------------------------
# the benchmark


THROUGHPUT_KEYS = ("env_steps_per_s", "steady_env_steps_per_s", "env_steps_per_cpu_s",
                   "startup_s", "e2e_s", "first_iteration_s", "env_steps", "cpu_s",
                   "load_1m_at_launch", "dask_overhead_share", "dask_overhead_share_total",
                   "iteration_s_median", "overhead_s_median")
SOLVE_KEYS = ("time_to_threshold_s", "train_time_to_threshold_s", "env_steps_to_threshold",
              "eval_return_mean")
HIGHER_IS_BETTER = ("env_steps_per_s", "steady_env_steps_per_s", "eval_return_mean")


def summarise(runs: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Median over repeats of each number, per system (never reaching counts as infinite)."""
    medians: dict[str, dict[str, Any]] = {}
    for system, reps in runs.items():
        m: dict[str, Any] = {}
        for key in THROUGHPUT_KEYS:
            m[key] = median(r.get("throughput", {}).get(key) for r in reps)
        for key in SOLVE_KEYS:
            missing = math.inf if key != "eval_return_mean" else None
            solved = [r["solve"] for r in reps if "solve" in r and "error" not in r["solve"]]
            m[key] = median((s.get(key) for s in solved), missing_as=missing)
        solved = [r["solve"] for r in reps if "solve" in r and "error" not in r["solve"]]
        m = {k: v for k, v in m.items() if v is not None}
        m["reached_threshold"] = f"{sum(s['reached'] for s in solved)}/{len(solved)}"
        m["eval_solved"] = f"{sum(s['eval_solved'] for s in solved)}/{len(solved)}"
        medians[system] = m
    return medians


TARGET_COLUMNS = ("daskrl", "daskrl-compile", "daskrl-stale", "daskrl-stale-compile")
"""The daskrl systems whose column the targets are read from."""


def ratios(medians: dict[str, dict[str, Any]], base: str, system: str = "daskrl"
           ) -> dict[str, dict[str, Any]]:
    """``system / base`` for every numeric median both have."""
    out: dict[str, dict[str, Any]] = {}
    if system not in medians or base not in medians:
        return out
    a, b = medians[system], medians[base]
    both = {k: ratio(a[k], b.get(k)) for k in a
            if isinstance(a[k], int | float) and not isinstance(a[k], bool)}
    out[f"{system}/{base}"] = {k: v for k, v in both.items() if v is not None}
    return out


def targets(medians: dict[str, dict[str, Any]], rat: dict[str, dict[str, Any]],
            threshold: float, solve_steps: int, system: str = "daskrl"
            ) -> list[dict[str, Any]]:
    """The project's targets read from ``system``'s column, each with the measured value
    and whether it is met (the overhead target only for on-policy daskrl)."""
    d = medians.get(system, {})
    r = rat.get(f"{system}/sb3", {})
    rows: list[dict[str, Any]] = []

    def add(name: str, goal: str, value: Any, met: bool | None) -> None:
        rows.append({"target": name, "goal": goal, "measured": value, "met": met})

    sps = r.get("env_steps_per_s")
    add("env-steps/s vs SB3 (end to end)", ">= 3x", sps, None if sps is None else sps >= 3)
    steady = r.get("steady_env_steps_per_s")
    add("env-steps/s vs SB3 (steady state)", ">= 3x", steady,
        None if steady is None else steady >= 3)
    ev = d.get("eval_return_mean")
    add(f"greedy eval after {solve_steps:,} env steps", f">= {threshold:g}", ev,
        None if ev is None else ev >= threshold)
    tt = r.get("time_to_threshold_s")
    d_tt, s_tt = d.get("time_to_threshold_s"), medians.get("sb3", {}).get("time_to_threshold_s")
    if tt is None and d_tt == math.inf:
        met_tt: bool | None = False
    elif tt is None and s_tt == math.inf and d_tt is not None:
        met_tt = True
    else:
        met_tt = None if tt is None else tt <= 1 / 3
    add(f"wall-clock to {threshold:g} vs SB3", "<= 1/3", tt, met_tt)
    ov = d.get("dask_overhead_share_total") if system == "daskrl" else None
    add("Dask overhead share of iteration time", "<= 5%", ov, None if ov is None else ov <= 0.05)
    return rows


def _num(value: Any) -> Any:
    """Undo :func:`_common.write_json`'s ``"inf"`` for infinite numbers."""
    return math.inf if value == "inf" else value


def render_markdown(result: dict[str, Any]) -> str:
    """The README section for these results: the table, the rule and the command."""
    s, med = result["settings"], result["medians"]
    systems = [x for x in SYSTEMS if x in med]
    r = result["ratios"].get("daskrl/sb3", {})
    thr = f"{s['threshold']:g}"
    lines = [
        ("env-steps/s, end to end (launch to last iteration)", "env_steps_per_s", 4),
        ("env-steps/s, steady state (first iteration left out)", "steady_env_steps_per_s", 4),
        ("env steps per CPU-second (all processes of the run)", "env_steps_per_cpu_s", 4),
        ("start-up: launch to first iteration start (s)", "startup_s", 3),
        (f"wall-clock to {thr}, from launch (s)", "time_to_threshold_s", 3),
        (f"wall-clock to {thr}, from training start (s)", "train_time_to_threshold_s", 3),
        (f"env steps to {thr}", "env_steps_to_threshold", 4),
        (f"reached {thr} (training rule), runs", "reached_threshold", 0),
        (f"greedy eval return after {s['solve_steps']:,} steps", "eval_return_mean", 4),
        ("Dask overhead share (all iterations but the first)", "dask_overhead_share_total", 2),
        ("load average (1 min) at launch, throughput runs", "load_1m_at_launch", 3),
    ]
    headers = ["median of " + str(s["repeats"])] + [LABELS[x] for x in systems]
    headers.append("daskrl / SB3")
    rows = []
    for label, key, digits in lines:
        row: list[str] = [label]
        for x in systems:
            v = _num(med[x].get(key))
            if key.startswith("dask_overhead") and x.startswith("daskrl-stale"):
                row.append("overlapped")  # rollout and update overlap: no serial remainder
            elif key.startswith("dask_overhead") and v is not None:
                row.append(f"{100 * v:.1f}%")
            else:
                row.append(fmt(v, digits) if not isinstance(v, str) else v)
        show = key in r and "overhead" not in key and not key.startswith("load")
        row.append(fmt(r.get(key), 3) if show else "")
        rows.append(row)
    table = markdown_table(headers, rows)
    found = result["targets"]
    found = found if isinstance(found, dict) else {"daskrl": found}  # older results: a list
    columns = [x for x in TARGET_COLUMNS if found.get(x)]
    cells = []
    for i, t in enumerate(found["daskrl"]):
        row = [t["target"], t["goal"]]
        for x in columns:
            u = found[x][i]
            value = (f"{100 * u['measured']:.1f}%" if "overhead" in u["target"]
                     and u["measured"] is not None else fmt(u["measured"], 3))
            row += [value, {True: "yes", False: "no", None: "-"}[u["met"]]]
        cells.append(row)
    heads = [h for x in columns for h in (LABELS[x], "met")]
    tgt = markdown_table(["target", "goal", *heads], cells, align="ll" + "rl" * len(columns))
    m = result["machine"]
    before, after = m["load_before"], m["load_after"]
    busy = " (machine shared: read the ratios, not the absolute numbers)" if m.get("busy") else ""
    code = f"{m['git_commit']}{' + local changes' if m['git_dirty'] else ''}"
    if m.get("daskrl_sources_sha256"):
        code += (" (daskrl/ and graphs/ copied at the start, sha256 "
                 f"{m['daskrl_sources_sha256'][:12]})")
    workers = (f"{s['workers']} workers" if s.get("workers") else
               "daskrl's default size: 1 worker for 1 rollout replica")
    stale_workers = (f"{s['workers']} workers" if s.get("workers") else
                     "daskrl's default: 2 workers, the learner apart")
    return "\n".join([
        "## PPO on CartPole-v1: daskrl vs Stable-Baselines3",
        "",
        "`ppo_cartpole.py` trains PPO on CartPole-v1 with the same settings in every system: "
        "8 envs x 128 steps, 4 epochs, minibatch 256, lr 2.5e-4 annealed linearly to 0, "
        "gamma 0.99, GAE lambda 0.95, clip 0.2, "
        + {True: "value loss clipped too (SB3: `clip_range_vf`), ",
           False: "value loss not clipped (SB3's default; daskrl's `--no-clip-vloss`), ",
           None: ""}[s["hyper"].get("clip_vloss")]
        + "entropy 0.01, value 0.5, grad-norm 0.5, "
        "separate 64x64 tanh actor and critic, CPU, one torch thread per process. "
        "daskrl runs `daskrl train graphs/ppo.py` (embedded LocalCluster, "
        f"{workers}, default actors-learner distribution, on-policy); SB3 runs PPO with a "
        "DummyVecEnv of 8 Monitor-wrapped envs; the *lean loop* calls the same actor and "
        "learner objects as daskrl's tasks in a plain Python loop (no Dask). "
        + (f"*{LABELS['daskrl-stale']}* is the opt-in `--distribution actors-learner:stale=1` "
           "(rollouts act with weights one update old and overlap the update, on "
           f"{stale_workers}; each rollout's batch is from the policy one update behind "
           "the learner, the PPO ratio taken against that policy); the targets are read "
           "from both columns. " if "daskrl-stale" in systems else "")
        + ("*--compile* compiles each whole gradient step (loss, gradients, clip and Adam "
           "step: `torch.compile`, its first step compiling; inductor's on-disk cache warm "
           "after the first run). " if any(x.endswith("compile") for x in systems) else "")
        + "Each run is its own process; the order of the systems rotates between repeats.",
        "",
        table,
        "",
        tgt,
        "",
        f"- **Throughput runs**: {s['steps']:,} env steps, no evaluation. *End to end* counts "
        "from process launch (imports, cluster, envs, model) to the end of the last iteration; "
        "*steady state* leaves out the first iteration. Each system counts env steps itself "
        "(daskrl leaves out gymnasium's auto-reset steps). *Per CPU-second* divides by the "
        "user + system CPU time of every process of the run (for daskrl: driver, scheduler, "
        "nannies, the worker fork server, workers), sampled every 50 ms while it runs, "
        "start-up and shutdown included; it depends less on the load than wall-clock rates "
        "do.",
        f"- **Time to {thr}**: separate runs of {s['solve_steps']:,} env steps. An iteration "
        f"reaches it when the training episodes of the latest whole iterations covering at "
        f"least {s['window']} episodes average >= {thr} (SB3: Monitor returns; daskrl: "
        "`episodes` and `episode_return_mean` of `metrics.csv`); time is taken at the end "
        "of that iteration's update. A run that never reaches it counts as infinite in the "
        f"median. The greedy evaluation is {s['hyper']['eval_episodes']} deterministic "
        "episodes at the end of the same runs.",
        "- **Dask overhead share** (daskrl, throughput runs): `sum(overhead_s) / "
        "sum(iteration_s)` over the rows of `metrics.csv` but the first (iteration time "
        "minus time inside the rollout and learner fragments; the driver runs several short "
        "iterations per task, so the gap between tasks lands on the first row of each), "
        "which is what `summary.json` reports as `dask_overhead_share`.",
        f"- Measured {m['load_before']['time']} on {m['cpu_model']} ({m['usable_cpus']} CPUs), "
        f"Python {m['python']}, torch {m['packages'].get('torch')}, dask "
        f"{m['packages'].get('dask')}, SB3 {m['packages'].get('stable-baselines3')}, daskrl "
        f"at {code}; load average "
        f"{before['load_1m']:.2f} before, {after['load_1m']:.2f} after{busy}. "
        "Raw numbers per repeat: [results/ppo_cartpole.json](results/ppo_cartpole.json).",
        "",
        "```bash",
        _command(shlex.split(result["command"])[2:]),
        "```",
    ])


def _command(argv: list[str]) -> str:
    """The command that reproduces a run, without options that do not change its numbers.

    Examples
    --------
    >>> _command(["--repeats", "3", "--work-dir", "/tmp/w", "--no-progress"])
    'python benchmarks/ppo_cartpole.py --repeats 3'
    """
    kept: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg in ("--work-dir", "--json", "--readme"):
            skip = True
        elif arg in ("--no-progress", "--no-readme") or arg.startswith(
                ("--work-dir=", "--json=", "--readme=")):
            pass
        else:
            kept.append(arg)
    return shlex.join(["python", "benchmarks/ppo_cartpole.py", *kept])
