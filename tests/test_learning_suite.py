"""The learning suite's verdicts (benchmarks/learning.py): a row trails its peer only when
daskrl's IQM lies below the peer's interval, and a row that shares another row's peer runs
reads them. The runs themselves are the benchmark's (minutes to hours); CI runs its --quick
smoke with the bench extra alone (.ci/extras.sh)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

pytest.importorskip("rliable", reason="the intervals need rliable (the sweep or bench extra)")

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def learning():
    sys.path.insert(0, str(BENCH))  # the script imports _common from its own folder
    try:
        spec = importlib.util.spec_from_file_location("learning_suite", BENCH / "learning.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # its dataclasses look their module up
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.path.remove(str(BENCH))
        sys.modules.pop("learning_suite", None)


def runs(row: str, system: str, finals: list[float]) -> list[dict]:
    return [{"row": row, "system": system, "seed": s + 1, "final_eval": f,
             "env_steps_per_s": 1000.0} for s, f in enumerate(finals)]


def test_a_row_trails_only_below_the_peers_interval(learning):
    row = learning.ROWS["ppo-cartpole"]
    peer = runs(row.name, "peer", [480.0, 490.0, 500.0, 500.0, 500.0])
    below = learning.summarise(row, runs(row.name, "daskrl", [100.0, 120.0, 150.0, 130.0,
                                                               110.0]) + peer, row.steps, 2000)
    inside = learning.summarise(row, runs(row.name, "daskrl", [470.0, 500.0, 495.0, 500.0,
                                                                485.0]) + peer, row.steps, 2000)
    above = learning.summarise(row, runs(row.name, "peer", [100.0, 120.0, 150.0, 130.0, 110.0])
                               + runs(row.name, "daskrl", [480.0, 490.0, 500.0, 500.0, 500.0]),
                               row.steps, 2000)
    assert below["trails"] is True and inside["trails"] is False
    assert [below["verdict"], inside["verdict"], above["verdict"]] == ["trails", "holds", "ahead"]
    assert inside["daskrl"]["low"] <= inside["daskrl"]["iqm"] <= inside["daskrl"]["high"]
    assert "**trails**" in learning.table([below]) and "holds" in learning.table([inside])


def test_a_row_without_a_peer_of_its_own_reads_the_shared_runs(learning, tmp_path):
    impala = learning.ROWS["impala-cartpole"]
    shared = learning.run_dir(tmp_path, impala, "peer", 2)
    assert shared == learning.run_dir(tmp_path, learning.ROWS[impala.peer_row], "peer", 2)
    summary = learning.summarise(
        impala, runs(impala.name, "daskrl", [500.0, 500.0, 480.0])
        + runs(impala.peer_row, "peer", [500.0, 450.0, 500.0])
        + runs(impala.name, "peer", [1.0, 1.0, 1.0]),  # never its own
        impala.steps, 500)
    assert summary["peer"]["finals"] == [500.0, 450.0, 500.0]
    assert summary["peer_name"] == "SB3 PPO"
