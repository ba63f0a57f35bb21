"""benchmarks/dqn_cartpole.py resumes: a call keeps the seeds its JSON holds with the same
settings, refuses in one line when the settings differ, and names each run's commit."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pytest
from script_loader import BENCH, script


@pytest.fixture(scope="module")
def bench():
    with script(BENCH / "dqn_cartpole.py", "dqn_cartpole_bench") as module:
        yield module


def saved(path: Path, eval_every: int = 25600) -> argparse.Namespace:
    settings = {"steps": 300_000, "eval_every": eval_every, "no_double_q_row": True,
                "compile_row": False}
    run = {"seed": 1, "env_steps_per_s": 1000.0, "time_to_475_s": 10.0, "final_eval": 500.0,
           "load_1m_before": 1.0, "load_1m_after": 1.0}
    path.write_text(json.dumps({"settings": settings, "load": {"before": {"load_1m": 1.0}},
                                "machine": {"git_commit": "aaaaaaa"},
                                "runs": {"daskrl": [run], "sb3": [run]}}))
    return argparse.Namespace(json=path, seeds=3, **settings)


def test_a_call_keeps_the_seeds_its_json_holds(bench, tmp_path):
    args = saved(tmp_path / "runs.json")
    _, runs = bench.kept_runs(args, ("daskrl", "sb3"))
    assert {name: [(r["seed"], r["code"]) for r in rs] for name, rs in runs.items()} == {
        "daskrl": [(1, "aaaaaaa")], "sb3": [(1, "aaaaaaa")]}
    runs["sb3"].append({"seed": 2, "code": "bbbbbbb"})
    assert bench._code({"machine": {"git_commit": "bbbbbbb"}, "runs": runs}) == (
        "code at aaaaaaa (seed 1), bbbbbbb (seed 2)")


def test_other_settings_are_refused_naming_fresh(bench, tmp_path):
    args = saved(tmp_path / "runs.json")
    args.eval_every = 5120
    with pytest.raises(SystemExit, match="another eval_every: add --fresh"):
        bench.kept_runs(args, ("daskrl", "sb3"))


def test_a_resumed_call_runs_only_the_seeds_it_lacks(bench, tmp_path, monkeypatch):
    import subprocess
    import types

    args = saved(tmp_path / "runs.json")
    ran = []

    def fake_daskrl(steps, seed, eval_every, double_q, compiled):
        ran.append(("daskrl", seed))
        return {"env_steps_per_s": 2000.0, "time_to_475_s": 5.0, "final_eval": 500.0}

    real_run = subprocess.run

    def fake_sb3(cmd, **kwargs):
        if "--child" not in cmd:  # git, uptime: what the machine record asks
            return real_run(cmd, **kwargs)
        ran.append(("sb3", int(cmd[cmd.index("--seed") + 1])))
        run = {"env_steps_per_s": 1000.0, "time_to_475_s": 9.0, "final_eval": 480.0}
        return types.SimpleNamespace(stdout=json.dumps(run) + "\n")

    monkeypatch.setattr(bench, "run_daskrl", fake_daskrl)
    monkeypatch.setattr(subprocess, "run", fake_sb3)
    monkeypatch.setattr(sys, "argv", ["dqn_cartpole.py", "--seeds", "2", "--steps", "300000",
                                      "--no-double-q-row", "--eval-every", "25600",
                                      "--json", str(args.json)])
    bench.main()
    assert ran == [("daskrl", 2), ("sb3", 2)]
    written = json.loads(args.json.read_text())
    assert [r["seed"] for r in written["runs"]["daskrl"]] == [1, 2]
    assert written["runs"]["daskrl"][0]["code"] == "aaaaaaa"
