"""Process loss: ``kill -9`` a worker or the driver mid-training; the run still completes.

Worker loss runs under every distribution on an external ``dask scheduler`` with two
nanny-managed ``dask worker`` processes (shared by those tests: a killed worker comes back
under its name), and for ``actors-learner`` also on workers without a nanny (the pool
shrinks) and on the embedded cluster of ``daskrl train``. Driver loss kills ``daskrl train``
itself and continues with ``--resume``. Every run must end with one ``metrics.csv`` row per
iteration, in order, and an env-step counter that never repeats or skips an iteration; a
pool that shrinks to nothing must stop the run with a one-line error, not hang.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from distributed import Client

from daskrl.core.scheduler_workers import scheduler_workers
from daskrl.runtime.checkpoint import list_checkpoints, load_latest

pytestmark = pytest.mark.chaos

ROOT = Path(__file__).resolve().parents[1]
ENVS, STEPS, ACTORS = 4, 32, 2
SPI = ACTORS * ENVS * STEPS  # env steps an iteration asks for
ITERATIONS = 16
SMALL = ["--num-actors", str(ACTORS), "--num-envs", str(ENVS), "--num-steps", str(STEPS)]
PPO_SMALL = [*SMALL, "--update-epochs", "2", "--num-minibatches", "2"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rows(path: Path) -> list[dict[str, str]]:
    if not path.exists():
        return []
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


def _spawn(args: list[str], log: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    return subprocess.Popen(args, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env,
                            start_new_session=True, cwd=ROOT)


def _stop(procs: list[subprocess.Popen]) -> None:
    """Stop the process groups of ``procs`` (started in new sessions): TERM, then KILL."""
    for proc in reversed(procs):
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + 5
    for proc in procs:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=20)


def _train(tmp: Path, graph: str, out: Path, extra: list[str], log: str = "train.log"
           ) -> subprocess.Popen:
    return _spawn([sys.executable, "-m", "daskrl.cli", "train", graph, "--out", str(out),
                   "--steps", str(ITERATIONS * SPI), "--checkpoint-every", "2",
                   "--no-progress", "--no-eval", *extra], tmp / log)


def _wait_rows(proc: subprocess.Popen, out: Path, log: Path, n: int, limit: float = 240) -> int:
    """Wait until ``metrics.csv`` has ``n`` rows while ``proc`` runs; returns the row count."""
    deadline = time.monotonic() + limit
    while (count := len(_rows(out / "metrics.csv"))) < n:
        assert proc.poll() is None, f"the run ended early:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"no {n} rows in {limit}s:\n{log.read_text()[-3000:]}"
        time.sleep(0.1)
    return count


def _finished(proc: subprocess.Popen, log: Path, limit: float = 300) -> str:
    try:
        code = proc.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the run did not end in {limit}s:\n"
                             f"{log.read_text()[-3000:]}") from None
    text = log.read_text()
    assert code == 0, f"exit code {code}:\n{text[-3000:]}"
    return text


def _check_metrics(out: Path) -> list[dict[str, str]]:
    """Every iteration exactly once, in order, and env steps counted once per iteration."""
    rows = _rows(out / "metrics.csv")
    assert [int(r["iteration"]) for r in rows] == list(range(1, ITERATIONS + 1))
    own = [int(r["iteration_env_steps"]) for r in rows]
    assert min(own) > SPI // 2  # a few auto-reset steps carry no transition
    total = [int(r["env_steps"]) for r in rows]
    assert total == [sum(own[: i + 1]) for i in range(len(own))]  # no lost iteration counted
    summary = json.loads((out / "summary.json").read_text())
    assert summary["iterations"] == ITERATIONS
    assert summary["env_steps"] == total[-1]
    return rows


def _check_recovery(log: str) -> None:
    """The driver saw the loss and recovered, keeping its scheduler connection throughout."""
    assert "lost (" in log, log[-3000:]
    assert "scheduler-connection-lost" not in log, log[-3000:]
    assert "AssertionError" not in log, log[-3000:]  # the embedded scheduler logs here


def _rebuilt_after(rows: list[dict[str, str]], killed_at: int) -> bool:
    """Whether an iteration recorded after the kill built an actor or the learner again."""
    later = rows[max(1, killed_at):]  # iteration 1 builds everything anyway
    return any(int(r.get("actors_built") or 0) or r.get("learner_built") == "True"
               for r in later)


@pytest.fixture(scope="module")
def chaos_nanny_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """An external scheduler with nanny-managed workers ``a`` and ``b`` (CPU=1 each).

    Yields the folder of the logs; its ``address`` file holds the scheduler's address.
    """
    logs = tmp_path_factory.mktemp("nanny-cluster")
    address, procs = _external(logs, nanny=True)
    try:
        yield logs
    finally:
        _stop(procs)


def _external(logs: Path, nanny: bool) -> tuple[str, list[subprocess.Popen]]:
    port = _free_port()
    address = f"tcp://127.0.0.1:{port}"
    procs = [_spawn([sys.executable, "-m", "distributed.cli.dask_scheduler", "--host",
                     "127.0.0.1", "--port", str(port), "--dashboard-address", "127.0.0.1:0"],
                    logs / "scheduler.log")]
    (logs / "address").write_text(address)
    for name in ("a", "b"):
        args = [sys.executable, "-m", "distributed.cli.dask_worker", address, "--host",
                "127.0.0.1", "--nthreads", "1", "--name", name, "--resources", "CPU=1",
                "--dashboard-address", "127.0.0.1:0"]
        procs.append(_spawn(args + ([] if nanny else ["--no-nanny"]), logs / f"worker-{name}.log"))
    return address, procs


def _worker_pids(address: str) -> dict[str, int]:
    """Worker name -> pid of the process that runs its tasks, once both workers are up."""
    with Client(address, timeout=60) as client:
        client.wait_for_workers(2, timeout=120)
        names = {addr: str(w["name"]) for addr, w in scheduler_workers(client).items()}
        return {names[addr]: pid for addr, pid in client.run(os.getpid).items() if addr in names}


def _kill_worker_mid_run(tmp: Path, cluster: Path, graph: str, extra: list[str]
                         ) -> tuple[list[dict[str, str]], str]:
    """Train on the external ``cluster``, kill -9 worker ``a`` after two iterations."""
    address, scheduler_log = (cluster / "address").read_text(), cluster / "scheduler.log"
    victim = _worker_pids(address)["a"]  # a holds the learner and rollout replica 0
    logged = scheduler_log.stat().st_size
    out, log = tmp / "run", tmp / "train.log"
    train = _train(tmp, graph, out, ["--scheduler", address, *extra])
    try:
        killed_at = _wait_rows(train, out, log, 2)
        os.kill(victim, signal.SIGKILL)
        text = _finished(train, log)
    finally:
        _stop([train])
    rows = _check_metrics(out)
    _check_recovery(text)
    scheduler = scheduler_log.read_bytes()[logged:].decode(errors="replace")
    assert "AssertionError" not in scheduler, scheduler[-3000:]
    assert _rebuilt_after(rows, killed_at), [r["rollout_workers"] for r in rows]
    return rows, text


@pytest.mark.parametrize("distribution", [
    "actors-learner", "central-inference", "data-parallel", "async",
    "data-parallel:allreduce=torch",  # a gloo error on the survivor counts as a lost worker
    # several iterations per task: at most 2, so that the kill lands mid-run
    "single:iterations_per_task=2",
    # one rollout replica: its worker and the learner's pass batches and weights directly
    "actors-learner:stale=1,iterations_per_task=2",
])
def test_every_distribution_survives_a_killed_worker(
        tmp_path: Path, chaos_nanny_cluster: Path, distribution: str) -> None:
    graph, extra = ("graphs/a3c.py", SMALL) if distribution == "async" else (
        "graphs/ppo.py", PPO_SMALL)
    if "stale" in distribution:  # one replica, as many env steps per iteration
        extra = [*extra, "--num-actors", "1", "--num-envs", str(ACTORS * ENVS)]
    _kill_worker_mid_run(tmp_path, chaos_nanny_cluster, graph,
                         ["--distribution", distribution, *extra])


def test_a_league_survives_losing_its_coordinators_worker(
        tmp_path: Path, chaos_nanny_cluster: Path) -> None:
    """The coordinator sits on worker ``a``, which is killed mid-run: the league goes on from
    its last checkpoint (every 2 iterations, as are the snapshots), so no snapshot is lost."""
    league = ["--env", "tictactoe_v3", *SMALL, "--snapshot-every", "2", "--torso", "mlp",
              "--hidden", "16", "--resources", "coordinator=CPU:1"]
    rows, _ = _kill_worker_mid_run(tmp_path, chaos_nanny_cluster, "graphs/league.py", league)
    assert rows[0]["coordinator_worker"] == "a"
    members = [int(float(r["league/members"])) for r in rows]
    assert members == sorted(members) and members[-1] == 1 + ITERATIONS // 2 + 1, members
    kept = load_latest(tmp_path / "run" / "checkpoints")["coordinator"]
    assert [m["name"] for m in kept["members"]] == [
        "random", *(f"v{k}" for k in range(0, ITERATIONS + 1, 2))]


def test_the_pool_shrinks_without_a_nanny(tmp_path: Path) -> None:
    _, procs = _external(tmp_path, nanny=False)
    try:
        rows, _ = _kill_worker_mid_run(tmp_path, tmp_path, "graphs/ppo.py", PPO_SMALL)
    finally:
        _stop(procs)
    # worker a never comes back: the last iterations ran all replicas and the learner on b
    assert rows[-1]["learner_worker"] == "b"
    assert all(w.endswith("@b") for w in rows[-1]["rollout_workers"].split(";"))


def test_a_pool_that_shrinks_to_nothing_stops_the_run_with_a_clear_error(tmp_path: Path
                                                                         ) -> None:
    address, procs = _external(tmp_path, nanny=False)
    try:
        pids = _worker_pids(address)
        out, log = tmp_path / "run", tmp_path / "train.log"
        # nothing comes back: a 3 s wait for replacements shows the same error as 30 s
        train = _train(tmp_path, "graphs/ppo.py", out, ["--scheduler", address, *PPO_SMALL,
                                                        "--replan-timeout", "3"])
        procs.append(train)
        _wait_rows(train, out, log, 2)
        for pid in pids.values():
            os.kill(pid, signal.SIGKILL)
        try:
            code = train.wait(timeout=120)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the run hangs:\n{log.read_text()[-3000:]}") from None
    finally:
        _stop(procs)
    text = log.read_text()
    assert code == 2, text[-3000:]
    assert "daskrl: error: the cluster lost the workers this run needs" in text, text[-3000:]
    assert "none came back within 3 s (--replan-timeout)" in text, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    assert list_checkpoints(out / "checkpoints")  # the last finished iteration is kept


def _worker_processes(proc: subprocess.Popen, count: int, limit: float = 120) -> list[int]:
    """Pids of the embedded cluster's worker processes (children of ``daskrl train``)."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        # workers are spawned (``spawn_main``) or forked from daskrl's worker fork server
        # (they keep its command line; the server itself is a child of daskrl train)
        descendants = psutil.Process(proc.pid).children(recursive=True)
        servers = {c.pid for c in descendants if c.ppid() == proc.pid
                   and "forkserver" in " ".join(c.cmdline())}
        kids = [c for c in descendants
                if "spawn_main" in " ".join(c.cmdline()) or c.ppid() in servers]
        if len(kids) >= count:
            return [c.pid for c in sorted(kids, key=lambda c: c.create_time())]
        time.sleep(0.2)
    raise AssertionError(f"daskrl train started fewer than {count} worker processes")


def test_embedded_cluster_survives_a_killed_worker(tmp_path: Path) -> None:
    out, log = tmp_path / "run", tmp_path / "train.log"
    train = _train(tmp_path, "graphs/ppo.py", out, ["--workers", "2", *PPO_SMALL])
    try:
        killed_at = _wait_rows(train, out, log, 2)
        os.kill(_worker_processes(train, 2)[0], signal.SIGKILL)
        text = _finished(train, log)
    finally:
        _stop([train])
    rows = _check_metrics(out)
    _check_recovery(text)
    assert _rebuilt_after(rows, killed_at), [r["rollout_workers"] for r in rows]


def test_resume_after_the_driver_is_killed(tmp_path: Path) -> None:
    out = tmp_path / "run"
    args = ["--workers", "2", *PPO_SMALL]
    first = _train(tmp_path, "graphs/ppo.py", out, args, log="first.log")
    try:
        _wait_rows(first, out, tmp_path / "first.log", 5)  # a checkpoint at 2 or 4
        workers = [psutil.Process(pid) for pid in _worker_processes(first, 2)]
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=20)
        _, left = psutil.wait_procs(workers, timeout=60)  # they leave with their scheduler
        assert not left, f"workers {left} outlived the killed driver"
    finally:
        try:
            os.killpg(first.pid, signal.SIGKILL)  # whatever is left of its session
        except ProcessLookupError:
            pass
    done = _rows(out / "metrics.csv")
    assert 5 <= len(done) < ITERATIONS, "the kill did not land mid-run"
    kept = max(int(p.stem.split("-")[1]) for p in (out / "checkpoints").glob("ckpt-*.pt"))
    second = _train(tmp_path, "graphs/ppo.py", out, [*args, "--resume"], log="second.log")
    try:
        _finished(second, tmp_path / "second.log")
    finally:
        _stop([second])
    rows = _check_metrics(out)
    assert rows[:kept] == done[:kept]  # iterations up to the checkpoint were not run again
    walls = [float(r["wall_s"]) for r in rows]
    assert walls == sorted(walls)  # the wall-clock counter continued from the checkpoint
