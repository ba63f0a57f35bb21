"""benchmarks/budgets.py keeps the runs its JSON records: a call runs only the jobs the JSON
lacks, keeps a run another call recorded while it ran, and ``--fresh`` forgets only the jobs
it is asked. The runs themselves are the benchmark's (minutes to hours each)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from script_loader import BENCH, script


@pytest.fixture(scope="module")
def budgets():
    with script(BENCH / "budgets.py", "budgets_bench") as module:
        yield module


def record(graph: str, budget: int, seed: int, final: float) -> dict[str, Any]:
    return {"graph": graph, "budget": budget, "seed": seed, "final_eval": final,
            "train_return_last_10pct": final, "env_steps_per_s": 100.0}


def call(budgets, monkeypatch, tmp_path: Path, argv: list[str],
         meanwhile: tuple[dict[str, Any], ...] = ()) -> list[tuple[str, int, int]]:
    """Run ``budgets.main(argv)`` with each job's run faked (final eval 1.0); ``meanwhile``:
    runs another call records in the JSON while the first job runs (replacing its record of
    the same graph, budget and seed). The jobs run."""
    ran = []

    def key(r: dict[str, Any]) -> tuple[str, int, int]:
        return r["graph"], r["budget"], r["seed"]

    def fake(graph: str, budget: int, seed: int, work: Path) -> dict[str, Any]:
        if meanwhile and not ran:
            saved = json.loads((tmp_path / "b.json").read_text())
            other = {key(r) for r in meanwhile}
            saved["runs"] = [r for r in saved["runs"] if key(r) not in other] + list(meanwhile)
            (tmp_path / "b.json").write_text(json.dumps(saved))
        ran.append((graph, budget, seed))
        return record(graph, budget, seed, 1.0)

    monkeypatch.setattr(budgets, "run_one", fake)
    budgets.main([*argv, "--json", str(tmp_path / "b.json"), "--md", str(tmp_path / "b.md"),
                  "--work", str(tmp_path / "runs"), "--parallel", "1"])
    return ran


def finals(tmp_path: Path) -> dict[tuple[str, int, int], float]:
    runs = json.loads((tmp_path / "b.json").read_text())["runs"]
    return {(r["graph"], r["budget"], r["seed"]): r["final_eval"] for r in runs}


def test_a_call_runs_only_what_the_json_lacks_and_keeps_a_concurrent_run(
        budgets, monkeypatch, tmp_path):
    (tmp_path / "b.json").write_text(json.dumps({"runs": [
        record("sac", 20_000, 1, -120.0), record("ppo", 500_000, 1, 500.0)]}))
    # another call meanwhile records a new run and runs one of the kept ones again (--fresh)
    others = (record("td3", 20_000, 9, -130.0), record("ppo", 500_000, 1, 491.0))
    ran = call(budgets, monkeypatch, tmp_path,
               ["--graphs", "sac", "--multiples", "1", "--seeds", "1", "2"], meanwhile=others)
    assert ran == [("sac", 20_000, 2)]
    assert finals(tmp_path) == {("ppo", 500_000, 1): 491.0, ("sac", 20_000, 1): -120.0,
                                ("sac", 20_000, 2): 1.0, ("td3", 20_000, 9): -130.0}
    assert "| sac | 20,000 (1x) | -120.0, 1.0 |" in (tmp_path / "b.md").read_text()


def test_fresh_forgets_only_the_jobs_asked(budgets, monkeypatch, tmp_path):
    (tmp_path / "b.json").write_text(json.dumps({"runs": [
        record("sac", 20_000, 1, -120.0), record("sac", 20_000, 2, -130.0),
        record("ppo", 500_000, 1, 500.0)]}))
    ran = call(budgets, monkeypatch, tmp_path,
               ["--graphs", "sac", "--multiples", "1", "--seeds", "2", "--fresh"])
    assert ran == [("sac", 20_000, 2)]
    assert finals(tmp_path) == {("ppo", 500_000, 1): 500.0, ("sac", 20_000, 1): -120.0,
                                ("sac", 20_000, 2): 1.0}
