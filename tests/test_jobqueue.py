"""Batch-job pools without a batch system: the Slurm and PBS job scripts, the settings that
make them (YAML, flags), pool sizes, and pools run as local processes (the same machinery as
the batch jobs, no queue). The runs on a real Slurm are in ``test_jobqueue_slurm.py``."""

from __future__ import annotations

import argparse
import os
import signal
import time
from pathlib import Path

import pytest

from daskrl.cluster.forkserver import WORKER_MALLOC
from daskrl.cluster.jobqueue import (
    JobQueueSpec,
    add_jobqueue_flags,
    job_scripts,
    load_spec,
    size_pools,
    spec_from_args,
    start_pools,
)
from daskrl.core.scheduler_workers import scheduler_workers
from daskrl.distributions import get_distribution

pytestmark = pytest.mark.timeout(120)

REPO = Path(__file__).resolve().parent.parent


# --- job scripts ------------------------------------------------------------------------------

def test_slurm_job_scripts_carry_each_pools_resources():
    spec = JobQueueSpec(kind="slurm", queue="debug", walltime="00:20:00", cores=2, memory="4GB",
                        gpus_per_job=1, gpu_queue="gpu", gpu_cores=4, job_extra=["--exclusive"])
    cpu, gpu = job_scripts(spec).values()
    for line in ("#SBATCH -J daskrl-cpu", "#SBATCH -p debug", "#SBATCH -t 00:20:00",
                 "#SBATCH --cpus-per-task=2", "#SBATCH --mem=4G", "#SBATCH --exclusive",
                 "--name cpu-0", "--nthreads 2", "--resources CPU=2"):
        assert line in cpu, line
    assert "gres" not in cpu and "GPU" not in cpu
    for line in ("#SBATCH -J daskrl-gpu", "#SBATCH -p gpu", "#SBATCH --gres=gpu:1",
                 "#SBATCH --cpus-per-task=4", "#SBATCH --mem=4G", "#SBATCH --exclusive",
                 "--name gpu-0", "--resources CPU=4,GPU=1"):
        assert line in gpu, line


def test_pbs_job_scripts_select_gpus_and_queue():
    spec = JobQueueSpec(kind="pbs", queue="workq", walltime="02:00:00", cores=8, memory="16GB",
                        gpus_per_job=2, account="proj1")
    scripts = job_scripts(spec)
    assert "#PBS -l select=1:ncpus=8:mem=15GB" in scripts["cpu"]
    assert "#PBS -l select=1:ncpus=8:ngpus=2:mem=15GB" in scripts["gpu"]
    for script in scripts.values():
        assert "#PBS -q workq" in script and "#PBS -l walltime=02:00:00" in script
        assert "#PBS -A proj1" in script
    assert "--resources CPU=8,GPU=2" in scripts["gpu"]


def test_processes_split_cores_and_no_gpu_pool_without_gpus():
    scripts = job_scripts(JobQueueSpec(kind="slurm", cores=4, processes=2))
    assert list(scripts) == ["cpu"]
    assert "--nworkers 2" in scripts["cpu"] and "--resources CPU=2" in scripts["cpu"]


def test_importing_keeps_ctrl_c_a_keyboard_interrupt():
    # dask-jobqueue 0.9.0 sets SIGINT to sys.exit() on import; daskrl.cluster.jobqueue undoes it
    handler = signal.getsignal(signal.SIGINT)
    assert getattr(handler, "__module__", None) != "dask_jobqueue.runner"


# --- settings ---------------------------------------------------------------------------------

def test_load_spec_reads_yaml_then_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("kind: pbs\nqueue: long\ngpus-per-job: 1\nwalltime: 1:30:00\n"
                    "prologue: ['module load cuda']\n")
    spec = load_spec(path, {"queue": "short", "cores": None})
    assert (spec.kind, spec.queue, spec.gpus_per_job, spec.cores) == ("pbs", "short", 1, 1)
    assert spec.walltime == "01:30:00"  # YAML read 1:30:00 as 5400 seconds
    assert "module load cuda" in job_scripts(spec)["gpu"]


@pytest.mark.parametrize("text, words", [
    ("cpus: 2", "unknown key(s) cpus"),
    ("kind: sge", "not one of local, slurm, pbs"),
    ("memory: lots", "--memory 'lots' is not a size"),
    ("walltime: soon", "--walltime 'soon'"),
    ("gpu_jobs: 2", "--gpu-jobs 2 needs --gpus-per-job"),
    ("cores: 0", "--cores must be a whole number >= 1"),
    ("start_timeout: 20m", "must be at least start_timeout"),
    ("- a list", "expected a mapping"),
])
def test_bad_settings_name_the_problem(tmp_path, text, words):
    path = tmp_path / "bad.yaml"
    path.write_text(text + "\n")
    with pytest.raises(ValueError, match="bad.yaml") as info:
        load_spec(path)
    assert words in str(info.value)


def test_example_config_loads():
    spec = load_spec(REPO / "examples" / "cluster.yaml")
    assert spec.kind == "slurm" and spec.gpus_per_job == 1
    assert set(job_scripts(spec)) == {"cpu", "gpu"}


def test_cli_flags_build_the_spec(tmp_path):
    parser = argparse.ArgumentParser()
    add_jobqueue_flags(parser)
    assert spec_from_args(parser.parse_args([])) is None
    args = parser.parse_args(["--cluster", "slurm", "--queue", "debug", "--gpus-per-job", "1",
                              "--cores", "2", "--memory", "3GB", "--walltime", "00:05:00",
                              "--job-extra=--constraint=v100"])
    spec = spec_from_args(args)
    assert (spec.kind, spec.queue, spec.gpus_per_job, spec.cores, spec.memory) == (
        "slurm", "debug", 1, 2, "3GB")
    assert "#SBATCH --constraint=v100" in job_scripts(spec)["gpu"]
    with pytest.raises(ValueError, match="--cluster-config needs --cluster"):
        spec_from_args(parser.parse_args(["--cluster-config", "x.yaml"]))


def test_pools_are_sized_to_the_distribution(cluster_tiny_ppo):
    algo = cluster_tiny_ppo(num_actors=3)
    dist = get_distribution("actors-learner")
    two_pools = size_pools(JobQueueSpec(cores=2, gpus_per_job=1), algo, dist)
    assert (two_pools.cpu_jobs, two_pools.gpu_jobs) == (2, 1)  # 3 rollouts / 2 cores
    cpu_only = size_pools(JobQueueSpec(cores=2), algo, dist)  # learner falls back to a CPU
    assert (cpu_only.cpu_jobs, cpu_only.gpu_jobs) == (2, 0)
    fixed = size_pools(JobQueueSpec(cores=1, cpu_jobs=5), algo, dist)
    assert fixed.cpu_jobs == 5


# --- pools as local processes (the same machinery, no queue) ----------------------------------

def test_local_pools_advertise_resources_and_stop_their_processes(tmp_path):
    spec = JobQueueSpec(kind="local", cores=1, memory="1GB", gpus_per_job=1, cpu_jobs=1,
                        gpu_jobs=1, log_directory=str(tmp_path), start_timeout="60s")
    cluster, client = start_pools(spec)
    try:
        info = scheduler_workers(client).values()
        assert {w["name"]: w["resources"] for w in info} == {
            "cpu-0": {"CPU": 1}, "gpu-0": {"CPU": 1, "GPU": 1}}
        where = client.submit(os.getpid, resources={"GPU": 1}, pure=False)
        assert where.result(timeout=30) != os.getpid()
        env = client.run(lambda: os.environ.get("MALLOC_TRIM_THRESHOLD_"))
        assert set(env.values()) == {str(WORKER_MALLOC["MALLOC_TRIM_THRESHOLD_"])}
        sampling = client.run(lambda dask_worker: "profile" in dask_worker.periodic_callbacks)
        assert set(sampling.values()) == {False}  # Dask's sampling profiler is off
        pids = [int(p) for p in cluster.job_ids().values()]
    finally:
        client.close()
        cluster.close()
    deadline = time.monotonic() + 10
    while _groups_alive(pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _groups_alive(pids), "job processes outlived cluster.close()"
    assert (tmp_path / "cpu-0.log").exists()


def test_a_job_that_dies_at_start_fails_fast_naming_it(tmp_path):
    # fast: the job's end is noticed, not the 60 s start timeout (that would be a TimeoutError)
    spec = JobQueueSpec(kind="local", cpu_jobs=1, prologue=["echo no-such-module; exit 3"],
                        log_directory=str(tmp_path), start_timeout="60s")
    with pytest.raises(RuntimeError, match="cpu-0 ended before their worker connected"):
        start_pools(spec)
    assert "no-such-module" in (tmp_path / "cpu-0.log").read_text()


def _groups_alive(pgids: list[int]) -> list[int]:
    alive = []
    for pgid in pgids:
        try:
            os.killpg(pgid, 0)
            alive.append(pgid)
        except ProcessLookupError:
            pass
    return alive
