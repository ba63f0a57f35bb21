"""The learning suite's verdicts (benchmarks/learning.py): a row trails its peer only when
daskrl's IQM lies below the peer's interval, and a row that shares another row's peer runs
reads them. The runs themselves are the benchmark's (minutes to hours); CI runs its --quick
smoke with the bench extra alone (.ci/extras.sh)."""

from __future__ import annotations

import json

import pytest
from script_loader import BENCH, script

pytest.importorskip("rliable", reason="the intervals need rliable (the sweep or bench extra)")



@pytest.fixture(scope="module")
def learning():
    with script(BENCH / "learning.py", "learning_suite") as module:
        yield module


@pytest.fixture(scope="module")
def suite_rows():
    """The suite's rows (benchmarks/_learning_rows.py)."""
    with script(BENCH / "_learning_rows.py", "learning_rows") as module:
        yield module


def runs(row: str, system: str, finals: list[float]) -> list[dict]:
    return [{"row": row, "system": system, "seed": s + 1, "final_eval": f,
             "env_steps_per_s": 1000.0} for s, f in enumerate(finals)]


def test_a_row_trails_only_below_the_peers_interval(learning, suite_rows):
    row = suite_rows.ROWS["ppo-cartpole"]
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


def test_a_row_without_a_peer_of_its_own_reads_the_shared_runs(learning, suite_rows, tmp_path):
    impala = suite_rows.ROWS["impala-cartpole"]
    shared = suite_rows.run_dir(tmp_path, impala, "peer", 2)
    assert shared == suite_rows.run_dir(tmp_path, suite_rows.ROWS[impala.peer_row], "peer", 2)
    summary = learning.summarise(
        impala, runs(impala.name, "daskrl", [500.0, 500.0, 480.0])
        + runs(impala.peer_row, "peer", [500.0, 450.0, 500.0])
        + runs(impala.name, "peer", [1.0, 1.0, 1.0]),  # never its own
        impala.steps, 500)
    assert summary["peer"]["finals"] == [500.0, 450.0, 500.0]
    assert summary["peer_name"] == "SB3 PPO"


def recorded_runs(row: str, system: str, finals: list[float], curve: bool = True) -> list[dict]:
    """Runs as the suite's JSON records them, at the row's budget."""
    steps = {"mappo-spread": 320_000, "ppo-cartpole": 500_000, "dqn-cartpole": 100_000,
             "sac-pendulum": 20_000, "impala-cartpole": 500_000}[row]
    return [r | {"steps": steps, "load_before": None, "dir": f"no-such-folder/{row}",
                 "curve": [[0.0, float(steps)], [-30.0, r["final_eval"]]] if curve else None}
            for r in runs(row, system, finals)]


def test_a_call_keeps_the_runs_its_json_records_and_adds_to_them(learning, tmp_path):
    record = tmp_path / "learning.json"
    old = (recorded_runs("mappo-spread", "daskrl", [-20.0, -21.0])
           + recorded_runs("mappo-spread", "peer", [-19.0, -22.0])
           + recorded_runs("sac-pendulum", "daskrl", [-150.0], curve=False))
    record.write_text(json.dumps({"runs": old}))
    md = tmp_path / "learning.md"
    # seed 3 has not run and the run folder is empty: --no-run reports what the JSON holds
    learning.main(["--rows", "mappo-spread", "--seeds", "1", "2", "3", "--no-run",
                   "--work", str(tmp_path / "w"), "--json", str(record), "--md", str(md)])
    written = json.loads(record.read_text())
    assert {(r["row"], r["system"], r["seed"]) for r in written["runs"]} == {
        ("mappo-spread", "daskrl", 1), ("mappo-spread", "daskrl", 2),
        ("mappo-spread", "peer", 1), ("mappo-spread", "peer", 2), ("sac-pendulum", "daskrl", 1)}
    spread = next(r for r in written["rows"] if r["row"] == "mappo-spread")
    assert spread["daskrl"]["finals"] == [-20.0, -21.0]
    # a row not asked for this time stays in the report
    assert [r["row"] for r in written["rows"]] == ["sac-pendulum", "mappo-spread"]
    # the SAC run has no curve: its row is left out of the picture, and the page says so
    assert (tmp_path / "learning_curves.png").exists()
    assert "Not in the picture: 1 row whose" in md.read_text()


def test_the_curves_are_drawn_from_the_json_alone(learning, tmp_path, monkeypatch):
    drawn = []
    grid = learning.common_grid
    monkeypatch.setattr(learning, "common_grid",
                        lambda curves: drawn.append([c[1][-1] for c in curves]) or grid(curves))
    record = tmp_path / "learning.json"
    record.write_text(json.dumps({"runs": recorded_runs("mappo-spread", "daskrl", [-20.0, -21.0])
                                  + recorded_runs("mappo-spread", "peer", [-19.0, -22.0])}))
    md = tmp_path / "learning.md"
    learning.main(["--rows", "mappo-spread", "--seeds", "1", "2", "--no-run",
                   "--work", str(tmp_path / "w"), "--json", str(record), "--md", str(md)])
    # the run folders do not exist: each band is the two recorded curves of its system
    assert drawn == [[-20.0, -21.0], [-19.0, -22.0]]
    assert (tmp_path / "learning_curves.png").stat().st_size > 1000
    assert "Not in the picture" not in md.read_text()


def test_a_row_with_runs_lacking_a_curve_is_left_out_of_the_picture_and_named(
        learning, tmp_path, monkeypatch):
    drawn = []
    grid = learning.common_grid
    monkeypatch.setattr(learning, "common_grid",
                        lambda curves: drawn.append([c[1][-1] for c in curves]) or grid(curves))
    record = tmp_path / "learning.json"
    old = recorded_runs("sac-pendulum", "daskrl", [-150.0, -160.0])
    old[1]["curve"] = None  # recorded before the JSON kept curves, its folder gone
    record.write_text(json.dumps({"runs": old
                                  + recorded_runs("sac-pendulum", "peer", [-140.0, -170.0])
                                  + recorded_runs("mappo-spread", "daskrl", [-20.0, -21.0])
                                  + recorded_runs("mappo-spread", "peer", [-19.0, -22.0])}))
    md = tmp_path / "learning.md"
    # sac-hopper has no run yet: no panel either
    learning.main(["--rows", "sac-pendulum", "sac-hopper", "mappo-spread", "--seeds", "1", "2",
                   "--no-run", "--work", str(tmp_path / "w"), "--json", str(record),
                   "--md", str(md)])
    assert drawn == [[-20.0, -21.0], [-19.0, -22.0]]  # mappo-spread's panel alone
    text = md.read_text()
    assert "learning_curves.png" in text
    assert "Not in the picture: 1 row whose" in text
    assert ("- sac-pendulum (daskrl seed 2): `python benchmarks/learning.py --fresh --rows "
            "sac-pendulum --seeds 2`") in text
    # with every row left out there is no picture: an earlier one is removed, not linked
    spread = json.loads(record.read_text())["runs"]
    for r in spread:
        r["curve"] = None
    record.write_text(json.dumps({"runs": spread}))
    learning.main(["--rows", "sac-pendulum", "mappo-spread", "--seeds", "1", "2", "--no-run",
                   "--work", str(tmp_path / "w"), "--json", str(record), "--md", str(md)])
    assert not (tmp_path / "learning_curves.png").exists()
    assert "learning_curves.png" not in md.read_text()


def test_a_recorded_run_of_another_budget_is_kept_but_not_scored(learning, tmp_path, capsys):
    record = tmp_path / "learning.json"
    other = recorded_runs("mappo-spread", "daskrl", [-20.0, -21.0])
    other[1]["steps"] = 640_000
    record.write_text(json.dumps({"runs": other}))
    learning.main(["--rows", "mappo-spread", "--seeds", "1", "2", "--no-run",
                   "--work", str(tmp_path / "w"), "--json", str(record),
                   "--md", str(tmp_path / "learning.md")])
    assert "mappo-spread daskrl s2 ran 640,000 steps, not the row's 320,000: kept" in (
        capsys.readouterr().err)
    written = json.loads(record.read_text())
    assert [(r["seed"], r["steps"]) for r in written["runs"]] == [(1, 320_000), (2, 640_000)]
    assert written["rows"][0]["daskrl"]["finals"] == [-20.0]


def test_only_the_jobs_the_json_lacks_run(learning, suite_rows, tmp_path, monkeypatch):
    record = tmp_path / "learning.json"
    record.write_text(json.dumps({"runs": recorded_runs("mappo-spread", "daskrl", [-20.0, -21.0])
                                  + recorded_runs("mappo-spread", "peer", [-19.0])}))
    ran = []

    def fake_run(row, system, seed, steps, work, may_run):
        ran.append((row.name, system, seed, steps))
        # a call beside this one records a run meanwhile: the write keeps it
        if system == "peer" and row.name == "mappo-spread":
            later = json.loads(record.read_text())
            later["runs"] += recorded_runs("dqn-cartpole", "daskrl", [500.0])
            record.write_text(json.dumps(later))
        return recorded_runs(suite_rows.source_row(row, system).name,
                             system, [-1.0])[0] | {"seed": seed, "steps": steps}

    monkeypatch.setattr(learning, "run_one", fake_run)
    common = ["--work", str(tmp_path / "w"), "--json", str(record),
              "--md", str(tmp_path / "learning.md"), "--parallel", "1"]
    learning.main(["--rows", "mappo-spread", "--seeds", "1", "2", *common])
    assert ran == [("mappo-spread", "peer", 2, 320_000)]
    written = json.loads(record.read_text())
    assert ("dqn-cartpole", "daskrl", 1) in {(r["row"], r["system"], r["seed"])
                                             for r in written["runs"]}
    # IMPALA's peer runs are PPO's: a recorded one is not run again under IMPALA's name
    ran.clear()
    record.write_text(json.dumps({"runs": recorded_runs("ppo-cartpole", "peer", [500.0])}))
    learning.main(["--rows", "impala-cartpole", "--seeds", "1", *common])
    assert ran == [("impala-cartpole", "daskrl", 1, 500_000)]


def test_fresh_forgets_only_the_rows_and_seeds_asked(learning, tmp_path, monkeypatch):
    record = tmp_path / "learning.json"
    record.write_text(json.dumps({"runs": recorded_runs("mappo-spread", "daskrl", [-20.0, -21.0])
                                  + recorded_runs("sac-pendulum", "daskrl", [-150.0])}))
    ran = []

    def fake_run(row, system, seed, steps, work, may_run):
        ran.append((row.name, system, seed))
        return recorded_runs(row.name, system, [-5.0])[0] | {"seed": seed}

    monkeypatch.setattr(learning, "run_one", fake_run)
    learning.main(["--rows", "mappo-spread", "--seeds", "1", "--fresh", "--parallel", "1",
                   "--work", str(tmp_path / "w"), "--json", str(record),
                   "--md", str(tmp_path / "learning.md")])
    assert ran == [("mappo-spread", "daskrl", 1), ("mappo-spread", "peer", 1)]
    written = {(r["row"], r["system"], r["seed"]): r["final_eval"]
               for r in json.loads(record.read_text())["runs"]}
    assert written == {("mappo-spread", "daskrl", 1): -5.0, ("mappo-spread", "daskrl", 2): -21.0,
                       ("mappo-spread", "peer", 1): -5.0, ("sac-pendulum", "daskrl", 1): -150.0}
