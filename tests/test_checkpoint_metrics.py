"""Checkpoints (atomic, pruned, damaged files skipped) and metrics files (resume truncation).

The driver-level tests run on the in-process synchronous backend: no cluster needed.
"""

from __future__ import annotations

import csv
import json
import math
import time
from pathlib import Path

import pytest
import torch

from daskrl.core.failures import RunStopped
from daskrl.distributions import get_distribution
from daskrl.observe.metrics import MetricsWriter, write_summary
from daskrl.runtime.checkpoint import list_checkpoints, load_latest, save_checkpoint
from daskrl.runtime.driver import RunSettings, train
from daskrl.runtime.sync_backend import SyncBackend

pytestmark = pytest.mark.timeout(60)


def names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


# --------------------------------------------------------------------------- checkpoints


def test_save_checkpoint_names_and_round_trips(tmp_path):
    payload = {"version": 3, "learner": {"w": torch.arange(4.0)}, "counters": {"env_steps": 9}}
    path = save_checkpoint(tmp_path / "ckpt", 3, payload)
    assert path == tmp_path / "ckpt" / "ckpt-00000003.pt"
    loaded = load_latest(tmp_path / "ckpt")
    assert loaded["version"] == 3 and loaded["counters"] == {"env_steps": 9}
    assert torch.equal(loaded["learner"]["w"], torch.arange(4.0))


def test_save_checkpoint_keeps_the_newest_n(tmp_path):
    for it in (1, 2, 3, 10, 11):
        save_checkpoint(tmp_path, it, {"it": it}, keep=3)
    assert names(tmp_path) == ["ckpt-00000003.pt", "ckpt-00000010.pt", "ckpt-00000011.pt"]
    assert [p.name for p in list_checkpoints(tmp_path)] == names(tmp_path)  # oldest first
    assert load_latest(tmp_path) == {"it": 11}
    save_checkpoint(tmp_path, 12, {"it": 12}, keep=1)
    assert names(tmp_path) == ["ckpt-00000012.pt"]


def test_a_failed_save_leaves_no_partial_file_and_keeps_the_previous_one(tmp_path):
    save_checkpoint(tmp_path, 1, {"it": 1})
    with pytest.raises(Exception):  # noqa: B017 - whatever pickling raises
        save_checkpoint(tmp_path, 2, {"it": 2, "bad": lambda: None})
    assert names(tmp_path) == ["ckpt-00000001.pt"]  # no temp file, no torn ckpt-2
    assert load_latest(tmp_path) == {"it": 1}


@pytest.mark.parametrize("damage", [b"", b"garbage, not a zip", "truncate"])
def test_load_latest_skips_a_torn_or_garbage_checkpoint(tmp_path, damage):
    save_checkpoint(tmp_path, 4, {"it": 4, "w": torch.ones(1000)})
    good = save_checkpoint(tmp_path, 5, {"it": 5, "w": torch.ones(1000)})
    torn = tmp_path / "ckpt-00000006.pt"
    if damage == "truncate":  # a real checkpoint cut short, as a crash mid-copy leaves it
        torn.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    else:
        torn.write_bytes(damage)
    assert load_latest(tmp_path)["it"] == 5


def test_load_latest_ignores_other_files_and_missing_folders(tmp_path):
    assert load_latest(tmp_path / "nowhere") is None
    assert load_latest(tmp_path) is None
    save_checkpoint(tmp_path, 2, {"it": 2})
    torch.save({"it": 99}, tmp_path / "ckpt-99.pt")  # not the ckpt-<8 digits>.pt pattern
    torch.save({"it": 98}, tmp_path / ".tmp-abc.pt")  # a temp file of an interrupted save
    torch.save({"it": 97}, tmp_path / "ckpt-00000097.pt.bak")
    assert load_latest(tmp_path) == {"it": 2}
    assert [p.name for p in list_checkpoints(tmp_path)] == ["ckpt-00000002.pt"]


def test_load_latest_refuses_arbitrary_pickles(tmp_path):
    class Evil:
        def __reduce__(self):
            return (print, ("unpickled code ran",))

    save_checkpoint(tmp_path, 1, {"it": 1})
    with (tmp_path / "ckpt-00000002.pt").open("wb") as fh:
        torch.save({"it": 2, "x": Evil()}, fh)
    assert load_latest(tmp_path) == {"it": 1}  # weights_only: the pickle is skipped


def test_save_checkpoint_never_deletes_what_it_just_wrote(tmp_path):
    for it in (8, 9, 10):  # an earlier run in the same folder
        save_checkpoint(tmp_path, it, {"it": it}, keep=3)
    path = save_checkpoint(tmp_path, 1, {"it": 1}, keep=3)
    assert path.exists()


# --------------------------------------------------------------------------- metrics files


def write_rows(path, iterations, resume_after=None, extra=None):
    writer = MetricsWriter(path, resume_after=resume_after)
    for it in iterations:
        writer.write({"iteration": it, "env_steps": 10 * it, "loss": it / 2, **(extra or {})})
    writer.close()


def test_metrics_writer_orders_columns_and_formats_values(tmp_path):
    path = tmp_path / "metrics.csv"
    writer = MetricsWriter(path)
    writer.write({"zeta": 1, "loss": math.nan, "env_steps": 8, "iteration": 1, "x": 1 / 3})
    writer.close()
    lines = path.read_text().splitlines()
    assert lines[0] == "iteration,env_steps,loss,x,zeta"
    assert lines[1] == "1,8,,0.333333,1"  # NaN left empty, floats to 6 significant digits


def test_metrics_writer_resume_keeps_rows_after_the_checkpoint_in_a_backup(tmp_path, capsys):
    path = tmp_path / "metrics.csv"
    write_rows(path, range(1, 6))
    before = path.read_bytes()
    write_rows(path, [4, 5, 6], resume_after=3, extra={"new_column": 1})
    rows = read_csv(path)
    assert [r["iteration"] for r in rows] == ["1", "2", "3", "4", "5", "6"]
    # the late column widened the header; the rows written before have it empty
    assert list(rows[0]) == ["iteration", "env_steps", "loss", "new_column"]
    assert [r["new_column"] for r in rows] == ["", "", "", "1", "1", "1"]
    assert path.read_text().count("iteration") == 1
    assert [r["env_steps"] for r in rows] == ["10", "20", "30", "40", "50", "60"]
    assert (tmp_path / "metrics.csv.bak").read_bytes() == before  # nothing lost
    err = capsys.readouterr().err
    assert "rows of iterations 4-5" in err and "metrics.csv.bak" in err
    write_rows(path, [6, 7], resume_after=5)  # a second resume: a second backup
    assert (tmp_path / "metrics.csv.bak").read_bytes() == before
    assert [r["iteration"] for r in read_csv(tmp_path / "metrics.csv.bak.2")][-1] == "6"


def test_metrics_writer_resume_without_rows_to_drop_only_appends(tmp_path, capsys):
    path = tmp_path / "metrics.csv"
    write_rows(path, [1, 2])
    before = path.read_bytes()
    write_rows(path, [3], resume_after=2)
    assert path.read_bytes().startswith(before)
    assert not list(tmp_path.glob("*.bak*")) and capsys.readouterr().err == ""


def test_a_torn_last_row_is_kept_in_the_backup_not_joined_to_the_next(tmp_path):
    path = tmp_path / "metrics.csv"
    write_rows(path, [1, 2])
    path.write_text(path.read_text() + "3,30")  # the driver was killed mid-row
    write_rows(path, [3], resume_after=2)
    assert [r["iteration"] for r in read_csv(path)] == ["1", "2", "3"]
    assert (tmp_path / "metrics.csv.bak").read_text().endswith("3,30")


def test_a_metric_that_first_appears_later_gets_its_column(tmp_path):
    path = tmp_path / "metrics.csv"
    writer = MetricsWriter(path)
    writer.write({"iteration": 1, "env_steps": 8, "loss": 0.5})
    writer.write({"iteration": 2, "env_steps": 16, "loss": 0.25, "eval_return_mean": 7.5})
    writer.write({"iteration": 3, "env_steps": 24, "loss": 0.125})
    writer.close()
    rows = read_csv(path)
    assert [r["eval_return_mean"] for r in rows] == ["", "7.5", ""]
    assert [r["loss"] for r in rows] == ["0.5", "0.25", "0.125"]
    assert not [p for p in tmp_path.iterdir() if p.name != "metrics.csv"]  # no temp file left


def test_a_failing_metrics_file_stops_the_run_in_one_line(tmp_path):
    path = tmp_path / "metrics.csv"
    writer = MetricsWriter(path)
    writer.write({"iteration": 1, "env_steps": 8})
    writer.fh.close()
    writer.fh = open("/dev/full", "w")  # noqa: SIM115 - every write fails with ENOSPC
    with pytest.raises(RunStopped, match=r"cannot write .*metrics.csv \(No space left"):
        writer.write({"iteration": 2, "env_steps": 16})
    writer.fh = None


def test_a_dead_tensorboard_writer_stops_the_run(tmp_path):
    pytest.importorskip("tensorboard")
    (tmp_path / "tb").write_text("a file where the event folder should be")
    writer = MetricsWriter(tmp_path / "metrics.csv", tensorboard=True)
    writer.write({"iteration": 1, "env_steps": 8})
    with pytest.raises(RunStopped, match="TensorBoard writer"):
        for it in range(2, 200):  # the thread fails on its first event
            writer.write({"iteration": it, "env_steps": 8 * it})
            time.sleep(0.05)
        writer.close()


def test_metrics_writer_resume_edge_cases(tmp_path):
    path = tmp_path / "metrics.csv"
    write_rows(path, [1, 2], resume_after=0)  # no file yet: a fresh one
    assert [r["iteration"] for r in read_csv(path)] == ["1", "2"]
    write_rows(path, [1], resume_after=0)  # resumed before the first checkpoint
    assert [r["iteration"] for r in read_csv(path)] == ["1"]
    write_rows(path, [1, 2, 3])  # not resuming: the file starts over
    write_rows(path, [], resume_after=5)  # resuming past the file's end keeps every row
    assert [r["iteration"] for r in read_csv(path)] == ["1", "2", "3"]


def test_write_summary_writes_nan_as_null(tmp_path):
    write_summary(tmp_path / "summary.json", {"b": math.nan, "a": 1.5, "c": "x"})
    text = (tmp_path / "summary.json").read_text()
    assert json.loads(text) == {"a": 1.5, "b": None, "c": "x"}
    assert text.index('"a"') < text.index('"b"')


# --------------------------------------------------------------------------- through the driver


def run(algo, out, steps, **kwargs):
    settings = RunSettings(out=out, steps=steps, seed=4, progress=False, eval=False,
                           tensorboard=False, **kwargs)
    return train(SyncBackend(), algo, get_distribution("actors-learner"), settings)


def test_resume_after_a_torn_checkpoint_continues_from_the_one_before(cluster_tiny_ppo, tmp_path):
    algo = cluster_tiny_ppo(num_actors=1)
    per_it = algo.steps_per_iteration
    # one iteration per task (task_s=0): a checkpoint at every multiple of 2
    first = run(algo, tmp_path, 4 * per_it, checkpoint_every=2, keep_checkpoints=5, task_s=0)
    ckpts = tmp_path / "checkpoints"
    assert names(ckpts) == ["ckpt-00000002.pt", "ckpt-00000004.pt"]
    before = read_csv(tmp_path / "metrics.csv")
    assert [int(r["env_steps"]) for r in before][-1] == first["env_steps"]
    # a crash while iteration 4's checkpoint was written, as a non-atomic copy leaves it
    (ckpts / "ckpt-00000004.pt").write_bytes(b"\x00" * 100)
    summary = run(algo, tmp_path, 5 * per_it, checkpoint_every=2, keep_checkpoints=5,
                  resume=True, task_s=0)
    rows = read_csv(tmp_path / "metrics.csv")
    assert [r["iteration"] for r in rows] == ["1", "2", "3", "4", "5"]
    assert rows[:2] == before[:2]  # kept as written; iterations 3-4 were redone
    steps = [int(r["env_steps"]) for r in rows]
    assert steps == sorted(steps) and summary["env_steps"] == steps[-1]
    assert steps[2] - steps[1] == int(rows[2]["iteration_env_steps"])
    assert load_latest(ckpts)["iteration"] == 5


def test_a_fresh_run_refuses_a_folder_with_an_earlier_runs_checkpoints(cluster_tiny_ppo,
                                                                       tmp_path):
    algo = cluster_tiny_ppo(num_actors=1)
    run(algo, tmp_path, 3 * algo.steps_per_iteration)
    before = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    with pytest.raises(ValueError, match="--resume"):
        run(algo, tmp_path, 1 * algo.steps_per_iteration)  # start over in the same folder
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == before
    assert len(read_csv(tmp_path / "metrics.csv")) == 3
