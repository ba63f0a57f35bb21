"""PPO CartPole benchmark: launching each system's run in its own process and reading
what it reports."""

from __future__ import annotations

import compileall
import csv
import hashlib
import json
import math
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psutil
from _common import (
    ROOT,
    median,
)
from _ppo_setup import ENV_ID, GRAPH, POLL_S, Hyper, Iteration, Trace

# ----------------------------------------------------------------------------------------
# running one system


def snapshot_sources(dest: Path) -> dict[str, Any]:
    """Copy ``daskrl/`` and ``graphs/`` to ``dest``, so every run measures the same code.

    The working tree may change while a long benchmark runs; runs import daskrl from this
    copy instead (``PYTHONPATH``). The copy is byte-compiled, as an installed package is
    (SB3's is): with ``PYTHONDONTWRITEBYTECODE`` set, every process would otherwise compile
    daskrl's sources again (~45 ms each). Returns the copy's path and a SHA-256 over its
    sources.
    """
    digest = hashlib.sha256()
    for package in ("daskrl", "graphs"):
        shutil.copytree(ROOT / package, dest / package,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        for file in sorted((dest / package).rglob("*")):
            if file.is_file():
                digest.update(str(file.relative_to(dest)).encode() + b"\0" + file.read_bytes())
        compileall.compile_dir(dest / package, quiet=1)
    return {"path": str(dest), "sha256": digest.hexdigest()}


def _child_env(threads: int, src: Path) -> dict[str, str]:
    env = dict(os.environ)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[var] = str(threads)
    env["PYTHONUNBUFFERED"] = "1"
    if src != ROOT:
        env["PYTHONPATH"] = os.pathsep.join(
            x for x in (str(src), env.get("PYTHONPATH", "")) if x)
    return env


@dataclass
class Launch:
    """How a child process went: when it started, the load then, the CPU it used."""

    t_launch: float
    load_1m: float
    cpu_s: float
    """User + system CPU seconds of the child and every process it started (sampled)."""


def _launch(cmd: list[str], log: Path, src: Path, threads: int, timeout: float,
            poll: Callable[[], None] | None = None) -> Launch:
    """Run ``cmd`` (output to ``log``) from ``src`` with the thread settings; wait for it."""
    with log.open("w") as fh:
        fh.write(shlex.join(cmd) + "\n")
        fh.flush()
        load = os.getloadavg()[0]
        t_launch = time.time()
        proc = subprocess.Popen(cmd, cwd=src, env=_child_env(threads, src), stdout=fh,
                                stderr=subprocess.STDOUT, start_new_session=True)
        cpu: dict[int, float] = {}
        _wait(proc, log, timeout, poll, cpu)
    return Launch(t_launch, load, sum(cpu.values()))


def _sample_cpu(root: int, cpu: dict[int, float]) -> None:
    """Record the CPU seconds so far of ``root`` and every process below it, by pid.

    Sampled, not taken from ``getrusage``: a process's CPU reaches its parent only when the
    parent waits for it, and daskrl's workers are forked from a server process that no one
    waits for.
    """
    try:
        top = psutil.Process(root)
        procs = [top, *top.children(recursive=True)]
    except psutil.Error:
        return
    for p in procs:
        try:
            t = p.cpu_times()
        except psutil.Error:
            continue
        cpu[p.pid] = max(cpu.get(p.pid, 0.0), t.user + t.system)


def _wait(proc: subprocess.Popen, log: Path, timeout: float,
          poll: Callable[[], None] | None = None, cpu: dict[int, float] | None = None
          ) -> None:
    """Wait for ``proc`` (calling ``poll`` and sampling its processes' CPU into ``cpu``
    meanwhile); on failure, raise with the log's tail."""
    deadline = time.monotonic() + timeout
    try:
        while proc.poll() is None:
            if cpu is not None:
                _sample_cpu(proc.pid, cpu)
            if poll is not None:
                poll()
            if time.monotonic() > deadline:
                raise TimeoutError(f"run exceeded {timeout:.0f}s")
            time.sleep(POLL_S)
    except BaseException:
        _kill(proc)
        raise
    if poll is not None:
        poll()
    if proc.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
        raise RuntimeError(f"exit status {proc.returncode}; see {log}:\n{tail}")


def _kill(proc: subprocess.Popen) -> None:
    """Stop a child started in its own session, with everything it started."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


class CsvFollower:
    """Reads rows appended to a CSV file as they appear, noting when each was first seen."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.header: list[str] | None = None
        self.rows: list[tuple[float, dict[str, str]]] = []
        self._fh: Any = None
        self._partial = ""

    def poll(self) -> None:
        """Read any complete lines written since the last call."""
        now = time.time()
        if self._fh is None:
            if not self.path.exists():
                return
            self._fh = self.path.open(newline="")
        data = self._partial + self._fh.read()
        lines = data.split("\n")
        self._partial = lines.pop()
        for line in lines:
            if not line.strip():
                continue
            values = next(csv.reader([line]))
            if self.header is None:
                self.header = values
            else:
                self.rows.append((now, dict(zip(self.header, values, strict=False))))

    def close(self) -> None:
        """Close the file."""
        if self._fh is not None:
            self._fh.close()


def _float(value: str | None) -> float | None:
    try:
        out = float(value) if value not in (None, "") else None
    except ValueError:
        return None
    return None if out is None or math.isnan(out) else out


def _cumulative_steps(column: list[int], total: int) -> list[int]:
    """Env steps so far per row of ``metrics.csv``, whether the column is cumulative or not.

    The contract says cumulative; some daskrl versions write each iteration's own count
    there instead. The summary's total tells the two apart.

    Examples
    --------
    >>> _cumulative_steps([10, 20, 30], 30), _cumulative_steps([10, 10, 10], 30)
    ([10, 20, 30], [10, 20, 30])
    """
    pairs = zip(column[:-1], column[1:], strict=True)
    if column and column[-1] == total and all(a <= b for a, b in pairs):
        return column
    out, acc = [], 0
    for n in column:
        acc += n
        out.append(acc)
    if acc != total:
        raise ValueError(f"metrics.csv env_steps add up to {acc}, summary.json says {total}")
    return out


def run_daskrl(steps: int, seed: int, out: Path, hp: Hyper, evaluate: bool, workers: int | None,
               threads: int, timeout: float, src: Path, on_row: Callable[[int], None],
               distribution: str = "actors-learner", flags: tuple[str, ...] = ()) -> Trace:
    """Train with ``daskrl train graphs/ppo.py [flags]`` in a subprocess and read its outputs.

    ``workers=None`` leaves the embedded cluster's size to daskrl (its default).

    Rows of ``metrics.csv`` are followed while the run goes on; their ``wall_s`` (the
    driver's clock from the start of its loop) is placed on the epoch clock by the earliest
    row, i.e. ``t_train_start = min(seen - wall_s)`` over rows (seen within ``POLL_S``).
    """
    out.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "daskrl.cli", "train", str(src / GRAPH), "--env", ENV_ID,
           "--steps", str(steps), "--seed", str(seed), "--distribution", distribution,
           "--out", str(out / "run"), "--no-progress", *hp.daskrl_flags(), *flags]
    if workers is not None:
        cmd += ["--workers", str(workers)]
    if not evaluate:
        cmd.append("--no-eval")
    log = out / "log.txt"
    follower = CsvFollower(out / "run" / "metrics.csv")

    def poll() -> None:
        before = len(follower.rows)
        follower.poll()
        if len(follower.rows) != before:
            on_row(len(follower.rows))

    try:
        launch = _launch(cmd, log, src, threads, timeout, poll)
    finally:
        follower.close()
    rows = follower.rows
    if not rows:
        raise RuntimeError(f"no metrics rows in {out / 'run'}")
    summary = json.loads((out / "run" / "summary.json").read_text())
    t0 = min(seen - float(r["wall_s"]) for seen, r in rows)
    steps = _cumulative_steps([int(float(r["env_steps"])) for _, r in rows],
                              int(summary["env_steps"]))
    iterations = [
        Iteration(t0 + float(r["wall_s"]), n, int(float(r.get("episodes") or 0)),
                  _float(r.get("episode_return_mean")))
        for (_, r), n in zip(rows, steps, strict=True)
    ]
    iter_s = [_float(r.get("iteration_s")) or 0.0 for _, r in rows[1:]]
    over_s = [_float(r.get("overhead_s")) or 0.0 for _, r in rows[1:]]
    extra = {
        "dask_overhead_share": summary.get("dask_overhead_share"),
        "dask_overhead_share_total": sum(over_s) / sum(iter_s) if sum(iter_s) > 0 else None,
        "iteration_s_median": median(iter_s),
        "overhead_s_median": median(over_s),
        "driver_wall_s": summary.get("wall_s"),
        "driver_env_steps_per_s": summary.get("env_steps_per_s"),
        "placement": summary.get("placement"),
        "metrics_env_steps_cumulative": steps == [int(float(r["env_steps"])) for _, r in rows],
        "load_1m_at_launch": launch.load_1m,
        "cpu_s": launch.cpu_s,
    }
    return Trace(launch.t_launch, t0, iterations, summary.get("eval_return_mean"), extra)


def run_child(system: str, steps: int, seed: int, out: Path, hp: Hyper, evaluate: bool,
              threads: int, timeout: float, src: Path) -> Trace:
    """Run SB3 or the lean loop in a subprocess of this script and read its trace."""
    out.mkdir(parents=True, exist_ok=True)
    trace_file = out / "trace.json"
    script = Path(__file__).resolve().with_name("ppo_cartpole.py")
    cmd = [sys.executable, str(script), "--child", system, "--child-out", str(trace_file),
           "--steps", str(steps), "--seed", str(seed),
           "--torch-threads", str(threads), "--child-hyper", json.dumps(asdict(hp)),
           "--child-graph", str(src / GRAPH)]
    if evaluate:
        cmd.append("--child-eval")
    launch = _launch(cmd, out / "log.txt", src, threads, timeout)
    data = json.loads(trace_file.read_text())
    extra = {**data.get("extra", {}), "load_1m_at_launch": launch.load_1m, "cpu_s": launch.cpu_s}
    return Trace(launch.t_launch, data["t_train_start"],
                 [Iteration(**it) for it in data["iterations"]], data.get("eval_return_mean"),
                 extra)
