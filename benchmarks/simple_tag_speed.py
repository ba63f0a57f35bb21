"""Agent-steps per second of batched simple tag against VMAS and mpe2.

Each (system, layout, total agents) configuration runs in its own subprocess,
so that its peak resident memory (``ru_maxrss``) is its own. Two layouts:

* ``small``: many environments of 4 agents (1 good, 3 adversaries, 2 obstacles),
  full observability, ``E = N / 4``;
* ``large``: environments of up to 1000 agents (1 good : 3 adversaries, 20
  obstacles), partial observability of the 8 nearest agents and 4 nearest
  obstacles, ``E = N / 1000`` (VMAS has no partial observability, so it observes
  everything there).

Rates are medians over ``--repeats`` timed runs of random actions, episodes of
25 steps with resets included. Run ``python benchmarks/simple_tag_speed.py -h``.

Examples
--------
``python benchmarks/simple_tag_speed.py --agents 4 1000 100000 --json out.json``
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SYSTEMS = ("marl", "vmas", "mpe2")
LAYOUTS = ("small", "large")
LARGE_ENV_AGENTS = 1000


def layout_of(layout: str, agents: int) -> dict[str, int]:
    """Environment count and team sizes for ``agents`` in total."""
    per_env = 4 if layout == "small" else min(agents, LARGE_ENV_AGENTS)
    if agents % per_env:
        raise ValueError(f"--agents {agents} is not a multiple of {per_env} ({layout} layout)")
    good = max(1, per_env // 4)
    return {
        "envs": agents // per_env,
        "agents_per_env": per_env,
        "num_good": good,
        "num_adversaries": per_env - good,
        "num_obstacles": 2 if layout == "small" else 20,
    }


# --------------------------------------------------------------------- workers
def _time_steps(
    step: Any, sync: Any, budget_s: float, repeats: int
) -> tuple[list[float], list[float]]:
    """Wall and CPU seconds per step of each repeat, steps per repeat sized to ``budget_s``.

    CPU time (all threads of the process) is robust to other load on the machine.
    """
    t = time.perf_counter()
    step()
    sync()
    per = max(time.perf_counter() - t, 1e-6)
    n = int(min(max(math.ceil(budget_s / per), 1), 500))
    wall, cpu = [], []
    for _ in range(repeats):
        t, c = time.perf_counter(), time.process_time()
        for _ in range(n):
            step()
        sync()
        wall.append((time.perf_counter() - t) / n)
        cpu.append((time.process_time() - c) / n)
    return wall, cpu


def run_worker(a: argparse.Namespace) -> dict[str, Any]:
    import torch

    if a.threads:
        torch.set_num_threads(a.threads)
    lay = layout_of(a.layout, a.n)
    e = lay["envs"]
    base_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    dev = torch.device(a.device)
    sync = (lambda: torch.cuda.synchronize()) if dev.type == "cuda" else (lambda: None)
    po = a.layout == "large"
    if a.system == "marl":
        sys.path.insert(0, str(ROOT))
        from marl.simple_tag import SimpleTag

        env = SimpleTag(
            e, num_good=lay["num_good"], num_adversaries=lay["num_adversaries"],
            num_obstacles=lay["num_obstacles"], num_agent_neighbors=8 if po else None,
            num_landmark_neighbors=4 if po else None, device=dev, compile=a.compile,
        )
        env.reset(seed=0)
        acts = torch.randint(0, 5, (8, e, env.num_agents), device=dev)
        it = iter(range(10**9))

        def step() -> None:
            env.step(acts[next(it) % 8])

    elif a.system == "vmas":
        import vmas

        env = vmas.make_env(
            "simple_tag", num_envs=e, device=dev, continuous_actions=False, seed=0,
            max_steps=25, num_good_agents=lay["num_good"],
            num_adversaries=lay["num_adversaries"], num_landmarks=lay["num_obstacles"],
        )
        env.reset()
        n_act = env.action_space[0].n
        acts = [torch.randint(0, n_act, (e,), device=dev) for _ in env.agents]

        def step() -> None:
            _, _, done, _ = env.step(acts)
            if bool(done.any()):
                env.reset()

    else:
        import numpy as np
        from mpe2 import simple_tag_v3

        kw = dict(num_good=lay["num_good"], num_adversaries=lay["num_adversaries"],
                  num_obstacles=lay["num_obstacles"], max_cycles=25)
        if po:
            kw.update(num_agent_neighbors=8, num_landmark_neighbors=4)
        envs = [simple_tag_v3.parallel_env(**kw) for _ in range(e)]
        for i, env in enumerate(envs):
            env.reset(seed=i)
        rng = np.random.default_rng(0)

        def step() -> None:
            for env in envs:
                if not env.agents:
                    env.reset()
                env.step({ag: int(rng.integers(0, 5)) for ag in env.agents})

    load_before = os.getloadavg()[0]
    per_step, cpu_step = _time_steps(step, sync, a.budget, a.repeats)
    rates = [a.n / s for s in per_step]
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    res = {
        "status": "ok",
        "agent_steps_per_s": statistics.median(rates),
        "rates": rates,
        "ms_per_step": statistics.median(per_step) * 1e3,
        "cpu_ms_per_step": statistics.median(cpu_step) * 1e3,
        "agent_steps_per_cpu_s": a.n / statistics.median(cpu_step),
        "load_avg_1m": [load_before, os.getloadavg()[0]],
        "peak_rss_mb": peak_kb / 1024,
        "base_rss_mb": base_rss / 1024,
        **lay,
    }
    if dev.type == "cuda":
        res["cuda_peak_mb"] = torch.cuda.max_memory_allocated() / 2**20
    return res


# ------------------------------------------------------------------ controller
def run_config(system: str, layout: str, n: int, a: argparse.Namespace) -> dict[str, Any]:
    limits = {"mpe2": ("mpe2-max-agents", a.mpe2_max_agents),
              "vmas": ("vmas-max-agents", a.vmas_max_agents)}
    if system == "vmas" and layout == "large":
        limits["vmas"] = ("vmas-large-max-agents", a.vmas_large_max_agents)
    if system in limits and n > limits[system][1]:
        flag, limit = limits[system]
        return {"status": "skipped", "reason": f"more than --{flag}={limit}"}
    cmd = [sys.executable, __file__, "--worker", system, layout, str(n), "--device", a.device,
           "--repeats", str(a.repeats), "--budget", str(a.budget),
           "--threads", str(a.threads)] + (["--compile"] if a.compile else [])
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout)
    except subprocess.TimeoutExpired:
        return {"status": "timeout", "reason": f"over {a.timeout} s"}
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if out.returncode != 0 or not lines:
        return {"status": "error", "reason": out.stderr.strip().splitlines()[-1:] or ["?"]}
    return json.loads(lines[-1])


def fmt_rate(r: dict[str, Any] | None) -> str:
    if not r or r.get("status") != "ok":
        return (r or {}).get("status", "-")
    return (f"{r['agent_steps_per_s'] / 1e6:.3g}M / {r['agent_steps_per_cpu_s'] / 1e6:.3g}M"
            f" / {r['peak_rss_mb']:.0f} MiB")


def markdown_table(results: dict[str, dict[str, Any]], systems: list[str]) -> str:
    head = ("Cells: agent-steps per wall second / per CPU second (all threads) / peak RSS; "
            "ratio: wall rates (CPU-second rates).\n\n")
    head += "| layout | agents | envs x agents/env | " + " | ".join(systems)
    head += " | marl / vmas |\n|---|---:|---|" + "---:|" * (len(systems) + 1) + "\n"
    rows = []
    for key, per in results.items():
        layout, n = key.split("/")
        lay = next((v for v in per.values() if v.get("status") == "ok"), None)
        shape = f"{lay['envs']} x {lay['agents_per_env']}" if lay else "-"
        ratio = "-"
        m, v = per.get("marl", {}), per.get("vmas", {})
        if m.get("status") == "ok" and v.get("status") == "ok":
            ratio = (f"{m['agent_steps_per_s'] / v['agent_steps_per_s']:.1f}x "
                     f"({m['agent_steps_per_cpu_s'] / v['agent_steps_per_cpu_s']:.1f}x)")
        cells = " | ".join(fmt_rate(per.get(s)) for s in systems)
        rows.append(f"| {layout} | {int(n):,} | {shape} | {cells} | {ratio} |")
    return head + "\n".join(rows) + "\n"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Measure simple-tag agent-steps/s of marl.SimpleTag, VMAS and mpe2 "
        "(median over repeats; peak RSS per configuration, each in its own subprocess).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--agents", type=int, nargs="+",
                   default=[4, 1000, 10_000, 100_000, 1_000_000],
                   metavar="N", help="total agents over all environments")
    p.add_argument("--layouts", nargs="+", choices=LAYOUTS, default=list(LAYOUTS),
                   help="small: envs of 4 agents; large: envs of up to 1000 agents, k=8")
    p.add_argument("--systems", nargs="+", choices=SYSTEMS, default=list(SYSTEMS))
    p.add_argument("--device", default="cpu", help="torch device, e.g. cpu or cuda")
    p.add_argument("--repeats", type=int, default=3, help="timed runs per configuration")
    p.add_argument("--budget", type=float, default=1.0, help="target seconds per timed run")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch default)")
    p.add_argument("--compile", action="store_true", help="torch.compile the marl kernels")
    p.add_argument("--timeout", type=float, default=180.0, help="seconds per configuration")
    p.add_argument("--mpe2-max-agents", type=int, default=1000, help="skip mpe2 above this")
    p.add_argument("--vmas-max-agents", type=int, default=10**9, help="skip VMAS above this")
    p.add_argument("--vmas-large-max-agents", type=int, default=1000,
                   help="skip VMAS in the large layout above this (its O(A^2) Python loops "
                   "over entity pairs take minutes per step at 1000 agents per env)")
    p.add_argument("--json", type=Path, help="write results to this JSON file")
    p.add_argument("--merge", action="store_true",
                   help="update the configurations measured now in an existing --json file")
    p.add_argument("--markdown", type=Path, help="print table to stdout and write it here")
    p.add_argument("--worker", nargs=3, metavar=("SYSTEM", "LAYOUT", "N"), help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.repeats < 1:
        p.error("--repeats must be >= 1")
    for n in a.agents:
        if n < 1:
            p.error(f"--agents values must be positive, got {n}")
        for layout in a.layouts:
            try:
                layout_of(layout, n)
            except ValueError as exc:
                p.error(str(exc))
    return a


def main(argv: list[str] | None = None) -> None:
    a = parse_args(argv)
    if a.worker:
        a.system, a.layout, n = a.worker
        a.n = int(n)
        print(json.dumps(run_worker(a)))
        return
    configs = [(lay, n, s) for lay in a.layouts for n in a.agents for s in a.systems]
    try:
        from tqdm import tqdm

        progress: Any = tqdm(configs, desc="configs", file=sys.stderr)
    except ImportError:
        progress = configs
    results: dict[str, dict[str, Any]] = {}
    for layout, n, system in progress:
        if hasattr(progress, "set_postfix_str"):
            progress.set_postfix_str(f"{system} {layout} {n}")
        results.setdefault(f"{layout}/{n}", {})[system] = run_config(system, layout, n, a)
    import torch

    meta = {
        "command": " ".join([Path(sys.argv[0]).as_posix()] + sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpu_count": os.cpu_count(),
        "device": a.device,
        "threads": a.threads or torch.get_num_threads(),
        "load_avg_1m": os.getloadavg()[0],
    }
    table = markdown_table(results, a.systems)
    print(table)
    if a.json:
        out = {"meta": meta, "results": results}
        if a.merge and a.json.exists():
            out = json.loads(a.json.read_text())
            out.setdefault("merged_runs", []).append(meta)
            for key, per in results.items():
                out["results"].setdefault(key, {}).update(per)
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(out, indent=2) + "\n")
    if a.markdown:
        a.markdown.write_text(table)


if __name__ == "__main__":
    main()
