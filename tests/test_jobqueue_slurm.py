"""Batch-job pools on a real Slurm: PPO, IMPALA and MAPPO train on Slurm jobs and the jobs
leave the queue; jobs Slurm cannot place, refuses or loses at start fail in one clear error.

They need the single-node Slurm that ``.ci/slurm-up.sh`` starts; without it (no ``sinfo``, or
the daemons are not up) they skip and say why. With a GPU declared on the node
(``DASKRL_SLURM_GPUS=1 bash .ci/slurm-up.sh``) PPO runs on a CPU job and a GPU job; otherwise
on two CPU jobs. MAPPO (``graphs/mappo.py`` with ``marl/``) runs the same way through the
``daskrl train --cluster slurm`` command line.
"""

from __future__ import annotations

import ast
import csv
import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path

import pytest
from distributed import Client

from daskrl.cli import main
from daskrl.cluster.jobqueue import (
    JobQueueSpec,
    make_jobqueue_cluster,
    start_pools,
    wait_for_pools,
)
from daskrl.core.scheduler_workers import scheduler_workers
from daskrl.core.script import load_graph
from daskrl.distributions import get_distribution
from daskrl.runtime.checkpoint import load_latest
from daskrl.runtime.driver import RunSettings, train

pytestmark = pytest.mark.timeout(120)

REPO = Path(__file__).resolve().parent.parent


def _run(*cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=20)


def slurm_unavailable() -> str | None:
    """Why Slurm cannot run jobs here, or None when a node is idle."""
    if shutil.which("sinfo") is None or shutil.which("sbatch") is None:
        return "Slurm is not installed (no sinfo/sbatch): run `bash .ci/slurm-up.sh` as root"
    try:
        out = _run("sinfo", "-h", "-o", "%t %G")
    except subprocess.TimeoutExpired:
        return "sinfo timed out: slurmctld is not answering; run `bash .ci/slurm-up.sh`"
    if out.returncode != 0:
        return f"Slurm daemons are not up ({out.stderr.strip()}): run `bash .ci/slurm-up.sh`"
    states = [line.split()[0] for line in out.stdout.splitlines() if line.strip()]
    if not any(s.startswith(("idle", "mix")) for s in states):
        return f"no idle Slurm node (states: {', '.join(states) or 'none'})"
    return None


@pytest.fixture(scope="module")
def slurm_node() -> dict[str, int]:
    """The local Slurm node: skips the test when Slurm is not up; says how many GPUs it has."""
    reason = slurm_unavailable()
    if reason:
        pytest.skip(reason)
    gres = _run("sinfo", "-h", "-o", "%G").stdout
    gpus = max((int(part.rsplit(":", 1)[-1].split("(")[0]) for part in gres.split(",")
                if part.startswith("gpu:")), default=0)
    return {"gpus": gpus}


def jobs_of(err: str) -> dict[str, str]:
    """The Slurm job of each worker, from the line the CLI prints on stderr."""
    found = re.search(r"^slurm: .*; jobs (\{.*\})$", err, re.MULTILINE)
    assert found, err
    return ast.literal_eval(found.group(1))


def job_state(job_id: str) -> str:
    """``"RUNNING gres:gpu:1"``: a job's state and GRES, as slurmctld reports them."""
    out = _run("scontrol", "-o", "show", "job", job_id).stdout
    fields = dict(f.split("=", 1) for f in out.split() if "=" in f)
    return f"{fields.get('JobState', '')} {fields.get('TresPerNode', '')}".strip()


def queued(job_ids: Iterable[str]) -> set[str]:
    """Which of ``job_ids`` are pending, running or completing now."""
    out = _run("squeue", "-h", "-o", "%i").stdout
    return set(out.split()) & set(job_ids)


def assert_jobs_leave_queue(job_ids: Iterable[str], timeout: float = 30) -> None:
    """Fail unless every one of ``job_ids`` has left Slurm's queue within ``timeout`` s."""
    job_ids = list(job_ids)
    deadline = time.monotonic() + timeout
    while queued(job_ids) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not queued(job_ids), f"jobs left in the queue: {queued(job_ids)}"


def test_ppo_trains_on_slurm_jobs_and_cancels_them(slurm_node, cluster_tiny_ppo, tmp_path):
    gpus = min(slurm_node["gpus"], 1)
    spec = JobQueueSpec(kind="slurm", cores=1, memory="1GB", walltime="00:10:00",
                        gpus_per_job=gpus, cpu_jobs=1 if gpus else 2,
                        log_directory=str(tmp_path / "jobs"), start_timeout="90s")
    algo, dist = cluster_tiny_ppo(), get_distribution("actors-learner")
    t0 = time.monotonic()
    cluster, client = start_pools(spec, algo, dist)
    ids = cluster.job_ids()
    try:
        expected = {"cpu-0", "gpu-0"} if gpus else {"cpu-0", "cpu-1"}
        assert set(ids) == expected
        states = {name: job_state(job) for name, job in ids.items()}
        assert all(s.startswith("RUNNING") for s in states.values()), states
        if gpus:
            assert states["gpu-0"] == "RUNNING gres:gpu:1", states
            assert states["cpu-0"] == "RUNNING", states
        # each worker runs inside its own Slurm job
        env = client.run(lambda: (os.environ.get("SLURM_JOB_ID"),
                                  os.environ.get("SLURM_GPUS_ON_NODE")))
        names = {addr: w["name"] for addr, w in scheduler_workers(client).items()}
        assert {names[addr]: job for addr, (job, _) in env.items()} == ids
        if gpus:
            assert [g for addr, (_, g) in env.items() if names[addr] == "gpu-0"] == ["1"]
        out = tmp_path / "run"
        summary = train(client, algo, dist,
                        RunSettings(out=out, steps=512, progress=False, tensorboard=False))
        with open(out / "metrics.csv") as f:
            rows = list(csv.DictReader(f))
        assert len(rows) == 2 and float(rows[-1]["env_steps"]) > 0
        used = {w for names_ in summary["placement"].values() for w in names_}
        assert used == expected  # both jobs did work
        assert (out / "summary.json").exists()
    finally:
        client.close()
        cluster.close()
    assert_jobs_leave_queue(ids.values())
    print(f"slurm PPO run with jobs {ids}: {time.monotonic() - t0:.1f}s")


def test_impala_free_running_actors_on_slurm_jobs(slurm_node, tmp_path, capfd):
    """IMPALA on a Slurm pool: two CPU jobs, an actor in each (the learner beside one of
    them, on its own clock); every iteration's batches land with no stall to recover from,
    and the jobs are cancelled."""
    impala = load_graph(str(REPO / "graphs" / "impala.py"))
    algo = impala.build(impala.Config(num_actors=2, num_envs=4, num_steps=32, eval_episodes=2))
    dist = get_distribution("impala:iterations_per_task=2")
    spec = JobQueueSpec(kind="slurm", cores=1, memory="1GB", walltime="00:10:00", cpu_jobs=2,
                        log_directory=str(tmp_path / "jobs"), start_timeout="90s")
    t0 = time.monotonic()
    cluster, client = start_pools(spec, algo, dist)
    ids = cluster.job_ids()
    try:
        assert set(ids) == {"cpu-0", "cpu-1"}
        out = tmp_path / "run"
        summary = train(client, algo, dist,
                        RunSettings(out=out, steps=6 * 256, progress=False, tensorboard=False))
        with open(out / "metrics.csv") as f:
            rows = list(csv.DictReader(f))
        assert [int(r["iteration"]) for r in rows] == list(range(1, 7))
        assert all(len(r["policy_lags"].split()) == 2 for r in rows)  # both actors' batches
        assert {r["learner_worker"] for r in rows} <= set(ids)
        # an actor in each job (in so short a run the learner may take every batch from the
        # first actor whose worker warmed up: it takes batches as they land)
        assert sorted(summary["placement"]["rollout"]) == sorted(ids), summary["placement"]
        assert {w.split("@")[1] for r in rows for w in r["rollout_workers"].split(";")} <= set(
            ids)
        assert summary["distribution"] == "impala" and summary["env_steps"] > 0
        # the learner's clock never stood still (its weights channel once stalled the
        # worker's client stream: a 60 s hang, a restarted worker, a resubmitted iteration)
        err = capfd.readouterr().err
        assert "daskrl: hang" not in err and "lost (" not in err, err[-2000:]
        assert len({r["learner_clock"] for r in rows}) == 1, [r["learner_clock"] for r in rows]
    finally:
        client.close()
        cluster.close()
    assert_jobs_leave_queue(ids.values())
    print(f"slurm IMPALA run with jobs {ids}: {time.monotonic() - t0:.1f}s")


def test_mappo_trains_on_slurm_jobs_through_the_cli_and_cancels_them(slurm_node, tmp_path,
                                                                     capsys):
    # two rollout replicas and the learner: a CPU job and a GPU job when the node has a GPU,
    # else two CPU jobs (the learner falls back to a CPU); the node has only 2 cores
    gpus = min(slurm_node["gpus"], 1)
    out = tmp_path / "run"
    t0 = time.monotonic()
    code = main(["train", str(REPO / "graphs" / "mappo.py"), "--cluster", "slurm",
                 "--cores", "1", "--memory", "1GB", "--walltime", "00:10:00",
                 "--gpus-per-job", str(gpus), "--cpu-jobs", "1" if gpus else "2",
                 "--num-actors", "2", "--num-envs", "8",
                 "--num-steps", "10", "--max-cycles", "10", "--update-epochs", "2",
                 "--hidden", "16", "--eval-episodes", "4", "--steps", "480",
                 "--out", str(out), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 0, err
    ids = jobs_of(err)
    expected = {"cpu-0", "gpu-0"} if gpus else {"cpu-0", "cpu-1"}
    assert set(ids) == expected
    # each worker ran in its batch job: Slurm wrote the job's output under its id
    for name, job in ids.items():
        log = (out / "jobs" / f"daskrl-{name.split('-')[0]}-{job}.err").read_text()
        assert re.search(rf"Worker name:\s+{name}$", log, re.MULTILINE), log[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["algorithm"] == "mappo" and summary["env_steps"] == 480
    placed = {role: set(names) for role, names in summary["placement"].items()}
    assert set().union(*placed.values()) == expected  # both jobs did work
    if gpus:
        assert placed["learner"] == {"gpu-0"} and placed["rollout"] == {"cpu-0"}
    with open(out / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 3
    for team in ("adversary", "good"):  # per-team returns of finished episodes, and losses
        assert all(row[f"losses/policy_loss/{team}"] for row in rows)
        assert any(row[f"return_mean/{team}"] for row in rows), rows[-1]
        assert isinstance(summary[f"eval_return_mean/{team}"], float)
    assert_jobs_leave_queue(ids.values())
    print(f"slurm MAPPO run with jobs {ids}: {time.monotonic() - t0:.1f}s")


def test_a_league_with_its_coordinator_trains_on_slurm_jobs(slurm_node, tmp_path, capsys):
    """The league's coordinator is one more role: it is placed on a Slurm job's worker
    like the others, and the run's checkpoint holds the league it kept there."""
    out = tmp_path / "league"
    code = main(["train", str(REPO / "graphs" / "league.py"), "--cluster", "slurm",
                 "--cores", "1", "--memory", "1GB", "--walltime", "00:10:00",
                 "--gpus-per-job", "0", "--cpu-jobs", "2", "--env", "tictactoe_v3",
                 "--num-actors", "2", "--num-envs", "8", "--num-steps", "4",
                 "--snapshot-every", "2", "--eval-games", "4", "--steps", "384",
                 "--out", str(out), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 0, err
    ids = jobs_of(err)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["placement"]["coordinator"] and set(
        summary["placement"]["coordinator"]) <= set(ids)
    league = load_latest(out / "checkpoints")["coordinator"]
    assert [m["name"] for m in league["members"]] == ["random", "v0", "v2", "v4", "v6"]
    assert_jobs_leave_queue(ids.values())


def test_a_job_slurm_cannot_place_times_out_with_its_reason(slurm_node, tmp_path):
    spec = JobQueueSpec(kind="slurm", cores=512, memory="1GB", cpu_jobs=1,
                        log_directory=str(tmp_path), start_timeout="3s")
    cluster = make_jobqueue_cluster(spec)
    ids = cluster.job_ids()
    try:
        with Client(cluster) as client, pytest.raises(TimeoutError) as info:
            wait_for_pools(client, cluster)
        assert f"{ids['cpu-0']} PENDING" in str(info.value)
    finally:
        cluster.close()
    assert_jobs_leave_queue(ids.values())


def test_a_refused_job_cancels_the_jobs_already_submitted(slurm_node):
    spec = JobQueueSpec(kind="slurm", cores=1, memory="1GB", cpu_jobs=1,
                        gpus_per_job=slurm_node["gpus"] + 8, gpu_jobs=1)
    before = set(_run("squeue", "-h", "-o", "%i").stdout.split())
    with pytest.raises(RuntimeError, match="^sbatch refused a job: sbatch: error"):
        make_jobqueue_cluster(spec)
    # the CPU job went in before the GPU job was refused: it is cancelled, not left to run
    submitted = set(_run("squeue", "-h", "-n", "daskrl-cpu", "-o", "%i").stdout.split()) - before
    assert_jobs_leave_queue(submitted, timeout=10)


def test_a_slurm_job_that_dies_at_start_fails_fast(slurm_node, tmp_path):
    # fast: the job's end is noticed, not the 60 s start timeout (that would be a TimeoutError)
    spec = JobQueueSpec(kind="slurm", cpu_jobs=1, prologue=["exit 3"],
                        log_directory=str(tmp_path), start_timeout="60s")
    with pytest.raises(RuntimeError, match="cpu-0 ended before their worker connected"):
        start_pools(spec)


def test_a_users_own_slurm_cluster_trains_ppo_through_daskrl_train(slurm_node, tmp_path):
    """dask-jobqueue as its users start it (no resources declared, integer worker names),
    handed to ``daskrl.train`` as a ``Client``."""
    from dask_jobqueue import SLURMCluster

    import daskrl

    with SLURMCluster(cores=1, memory="1GB", processes=1, walltime="00:10:00",
                      log_directory=str(tmp_path / "jobs"),
                      scheduler_options={"host": "127.0.0.1",
                                         "dashboard_address": "127.0.0.1:0"}) as cluster:
        cluster.scale(jobs=2)
        with Client(cluster) as client:
            client.wait_for_workers(2, timeout=90)
            run = daskrl.train(REPO / "graphs" / "ppo.py", client=client, steps=512,
                               out=tmp_path / "run", progress=False, num_actors=2, num_envs=4,
                               num_steps=32, update_epochs=2, num_minibatches=2,
                               eval_episodes=2)
            names = {w["name"] for w in scheduler_workers(client).values()}
    assert run.summary["iterations"] == 2 and run.summary["eval_return_mean"] > 0
    assert len(names) == 2


def test_a_sweep_trains_its_trials_on_slurm_jobs_and_cancels_them(slurm_node, tmp_path,
                                                                  capsys):
    """``daskrl sweep --cluster slurm``: two seeds side by side, one on each batch job's
    worker (runs from one process spread over the workers), the jobs gone at the end."""
    out = tmp_path / "sweep"
    code = main(["sweep", str(REPO / "graphs" / "ppo.py"), "--cluster", "slurm",
                 "--cores", "1", "--memory", "1GB", "--walltime", "00:10:00",
                 "--cpu-jobs", "2", "--seeds", "2", "--concurrency", "2", "--steps", "1024",
                 "--num-envs", "4", "--num-steps", "32", "--eval-episodes", "2",
                 "--out", str(out), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 0, err
    ids = jobs_of(err)
    sweep = json.loads((out / "sweep.json").read_text())
    assert {r["state"] for r in sweep["trials"].values()} == {"finished"}
    learners = {json.loads((out / name / "summary.json").read_text())["placement"]["learner"][0]
                for name in sweep["trials"]}
    assert learners == set(ids)  # one trial on each job's worker
    assert "IQM" in (out / "report.md").read_text()
    assert_jobs_leave_queue(ids.values())
