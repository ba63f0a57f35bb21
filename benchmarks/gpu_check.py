"""One prepared check of MAPPO and batched simple tag on a GPU machine.

Sections (each timed, each failure caught and reported, the run goes on):

1. ``info``: torch, CUDA device, memory;
2. ``correctness``: fused team forward = per-agent forward, and GPU GAE = numpy GAE, on cuda;
3. ``env_1m``: fused simple-tag steps with random actions at 1M agents (250k envs of 4);
4. ``env_1m_large``: 1M agents as 1000 envs of 1000 agents observing their 8 nearest;
5. ``mappo_1m``: MAPPO training iterations (rollout of 25 steps + update) at 1M agents;
6. ``sweep``: the same iteration at 1k, 10k, 100k agents, and 4M when time is left.

Needs torch and this repository only (``dask`` is not needed: when it is missing, the
``daskrl`` package is loaded without its Dask layers). Prints each section's result and
writes everything to ``$OUT/gpu_check.json`` when ``OUT`` is set. Stops starting sections
once ``--budget-s`` (default 390 s) is spent.

Run: ``python benchmarks/gpu_check.py`` (``--budget-s 200`` for a shorter run). Without a
GPU (or with ``--dry-run``) it runs every section on the CPU at 1/1000 of the agents within
120 s, to check the script itself before a GPU machine is spent on it:
``python benchmarks/gpu_check.py --dry-run``.

The GPU target it reads off: ``mappo_1m``'s ``ms_per_env_step`` (the iteration's time over
its 25 env steps, rollout and update together) at most 150 ms on one H200.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))


def _load_daskrl() -> str:
    """Import ``daskrl``; without Dask installed, expose its package path without its
    ``__init__`` (the torch kernels MAPPO uses import nothing from Dask)."""
    try:
        import daskrl  # noqa: F401

        return "full"
    except ImportError as exc:
        pkg = types.ModuleType("daskrl")
        pkg.__path__ = [str(ROOT / "daskrl")]
        sys.modules["daskrl"] = pkg
        return f"kernels only ({exc})"


DEVICE = "cuda"


def _sync() -> None:
    import torch

    if DEVICE.startswith("cuda"):
        torch.cuda.synchronize()


def _peak_gib() -> float:
    import torch

    return torch.cuda.max_memory_allocated() / 2**30 if DEVICE.startswith("cuda") else 0.0


def info() -> dict[str, Any]:
    import torch

    out: dict[str, Any] = {"torch": torch.__version__, "cuda": torch.cuda.is_available(),
                           "python": sys.version.split()[0], "device_used": DEVICE}
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        out.update(device=p.name, memory_gib=round(p.total_memory / 2**30, 1),
                   multiprocessors=p.multi_processor_count)
    return out


def correctness() -> dict[str, Any]:
    import torch

    with torch.no_grad():
        return _correctness()


def _correctness() -> dict[str, Any]:
    import numpy as np
    import torch

    from daskrl.algos.gae import gae
    from marl.mappo import EnvSpec, MAPPOModel, ModelSpec, advantages, layout_of

    layout = layout_of(EnvSpec("simple_tag", num_good=2, num_adversaries=3))
    torch.manual_seed(0)
    model = MAPPOModel(layout, ModelSpec()).to(DEVICE)
    obs = torch.randn(64, layout.num_agents, layout.obs_dim, device=DEVICE)
    worst = 0.0
    for t, agents in enumerate(layout.agents):
        fused = model.logits(obs, t).view(64, len(agents), -1)
        d = layout.team_obs_dim(t)
        for j, i in enumerate(agents):
            one = model.actors[t](obs[:, i, :d])
            worst = max(worst, float((fused[:, j] - one).abs().max()))
    g = torch.Generator().manual_seed(0)
    r, v, nv = (torch.randn(25, 4096, generator=g) for _ in range(3))
    done = torch.rand(25, 4096, generator=g) < 0.1
    ref = gae(r.numpy(), v.numpy(), nv.numpy(), done.numpy(), done.numpy(), 0.99, 0.95)[0]
    got = advantages(*(x.to(DEVICE) for x in (r, v, nv, done, done)), 0.99, 0.95)[0]
    got = got.cpu().numpy()
    gae_err = float(np.abs(got - ref).max())
    return {"fused_vs_per_agent_max_abs": worst, "gae_max_abs": gae_err,
            "ok": worst < 1e-4 and gae_err < 1e-4}


def env_steps(envs: int, steps: int = 25, **overrides: Any) -> dict[str, Any]:
    import torch

    from marl.simple_tag import SimpleTag

    env = SimpleTag(envs, device=DEVICE, **overrides)
    env.reset(seed=0)
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    shape = (envs, env.num_agents)
    for _ in range(3):
        env.step(torch.randint(0, 5, shape, device=DEVICE, generator=gen))
    _sync()
    t0 = time.perf_counter()
    for _ in range(steps):
        env.step(torch.randint(0, 5, shape, device=DEVICE, generator=gen))
    _sync()
    dt = (time.perf_counter() - t0) / steps
    agents = envs * env.num_agents
    return {"agents": agents, "envs": envs, "neighbor_method": env.neighbor_method,
            "step_ms": dt * 1e3, "agent_steps_per_s": agents / dt,
            "peak_gpu_gib": _peak_gib()}


def mappo(agents: int, iterations: int = 2) -> dict[str, Any]:
    import torch
    from mappo_scale import time_inline

    if DEVICE.startswith("cuda"):
        torch.cuda.empty_cache()
    res = time_inline(agents, DEVICE, iterations=iterations, update_epochs=4,
                      minibatch_agents=1 << 20)
    res.pop("iteration_s_all", None)
    res["ms_per_env_step"] = res["iteration_s"] / 25 * 1e3  # the GPU target's unit
    return res


def main(argv: list[str] | None = None) -> int:
    """Run every section within the budget; print and save the results."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--budget-s", type=float, default=390.0,
                   help="start no section after this many seconds")
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu for a smoke test")
    p.add_argument("--scale", type=float, default=1.0,
                   help="multiply every agent count (e.g. 0.001 with --device cpu)")
    p.add_argument("--dry-run", action="store_true",
                   help="--device cpu --scale 0.001 --budget-s 120: check the script itself")
    args = p.parse_args(argv)
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available() and not args.dry_run:
        print("no GPU visible to torch: running the CPU dry run instead (--dry-run)", flush=True)
        args.dry_run = True
    if args.dry_run:
        args.device, args.scale, args.budget_s = "cpu", min(args.scale, 0.001), min(
            args.budget_s, 120.0)
        torch.set_num_threads(1)  # a shared CPU: more threads only wait on each other
    global DEVICE
    DEVICE = args.device
    start = time.perf_counter()
    report: dict[str, Any] = {"sections": {}, "budget_s": args.budget_s,
                              "daskrl": _load_daskrl(), "scale": args.scale,
                              "device": args.device, "dry_run": args.dry_run,
                              "load_1m": os.getloadavg()[0]}

    def n(agents: int) -> int:
        return max(4, int(agents * args.scale) // 4 * 4)

    def after_1m(factor: float) -> float:
        """Seconds a section ``factor`` times the 1M-agent iteration needs (inf if that failed)."""
        one = report["sections"].get("mappo_1m", {}).get("iteration_s")
        return float("inf") if one is None else 30.0 + factor * 2 * one

    plan: list[tuple[str, Callable[[], Any], float | Callable[[], float]]] = [
        ("info", info, 0),
        ("correctness", correctness, 20),
        ("env_1m", lambda: env_steps(n(1_000_000) // 4), 30),
        ("env_1m_large", lambda: env_steps(max(1, n(1_000_000) // 1000), num_good=250,
                                           num_adversaries=750, num_obstacles=20,
                                           num_agent_neighbors=8, num_landmark_neighbors=4), 60),
        ("mappo_1m", lambda: mappo(n(1_000_000)), 150),
        ("sweep_1k", lambda: mappo(n(1000)), 20),
        ("sweep_10k", lambda: mappo(n(10_000)), 20),
        ("sweep_100k", lambda: mappo(n(100_000)), 40),
        ("sweep_4m", lambda: mappo(n(4_000_000), iterations=1), lambda: after_1m(4.0)),
    ]
    for name, fn, needs in plan:
        needs_s = (needs() if callable(needs) else needs) * (0.1 if args.dry_run else 1.0)
        elapsed = time.perf_counter() - start
        if elapsed + needs_s > args.budget_s:
            report["sections"][name] = {"skipped": f"budget: {elapsed:.0f}s spent, "
                                                   f"~{needs_s:.0f}s needed"}
            print(f"[{name}] skipped (budget)", flush=True)
            continue
        t0 = time.perf_counter()
        try:
            result: Any = fn()
            status = "ok"
        except Exception as exc:  # noqa: BLE001 - every section reports, the run goes on
            result = {"error": f"{type(exc).__name__}: {exc}",
                      "traceback": traceback.format_exc(limit=6)}
            status = "failed"
        took = time.perf_counter() - t0
        report["sections"][name] = {"status": status, "seconds": round(took, 2), **result}
        print(f"[{name}] {status} in {took:.1f}s: {json.dumps(result, default=str)}", flush=True)
    report["total_s"] = round(time.perf_counter() - start, 2)
    out = os.environ.get("OUT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "gpu_check.json").write_text(json.dumps(report, indent=2, default=str))
        print(f"wrote {out}/gpu_check.json")
    print(f"total {report['total_s']}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
