"""Hangs are not waited for silently: a worker that stops answering (SIGSTOP) and a fragment
stuck inside an env step are reported (key, worker, stack), the worker is restarted and the
run recovers with every iteration recorded once; past ``--max-recoveries`` the run stops
with one line.

Real processes: ``daskrl train`` with its embedded cluster (nanny-managed workers), a small
``--task-timeout`` so each test stays short.
"""

from __future__ import annotations

import os
import signal
import textwrap
from pathlib import Path

import pytest
from test_chaos import (
    ITERATIONS,
    PPO_SMALL,
    _check_metrics,
    _finished,
    _rows,
    _stop,
    _train,
    _wait_rows,
    _worker_processes,
)

from daskrl.runtime.checkpoint import list_checkpoints
from daskrl.runtime.engine import Activity
from daskrl.runtime.watchdog import find_hangs

pytestmark = pytest.mark.chaos

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = "12"  # seconds: longer than any task of these small runs, even under load

STUCK = textwrap.dedent('''

    import time
    import gymnasium as gym
    from pathlib import Path
    from dataclasses import replace

    MARKER = {marker!r}
    AGAIN = {again!r}
    _ppo_build = build


    class Stuck(gym.Wrapper):
        """Blocks forever in its 40th step, once (the marker file remembers); with AGAIN, in
        the AGAIN-th step of every env built after that."""

        def __init__(self, env):
            super().__init__(env)
            self.steps = 0

        def step(self, action):
            self.steps += 1
            again = AGAIN is not None and self.steps == AGAIN and Path(MARKER).exists()
            if again or (self.steps == 40 and not Path(MARKER).exists()):
                Path(MARKER).touch()
                while True:
                    time.sleep(1)  # a simulator that never returns
            return self.env.step(action)


    def stuck_actor(config, seed):
        if "Stuck-v0" not in gym.registry:
            gym.register("Stuck-v0", lambda **kw: Stuck(gym.make("CartPole-v1", **kw)))
        return VecEnvActor("Stuck-v0", config.num_envs, seed)


    def build(config):
        return replace(_ppo_build(config), make_actor=partial(stuck_actor, config))
''')


def test_find_hangs_picks_the_runs_tasks_past_their_bound() -> None:
    act = Activity(running={"rollout-1-it3-aaaa": ("w1", 30.0), "rollout-0-it3-bbbb": ("w0", 99.0),
                            "learner-0-it3-aaaa": ("w0", 1.0), "rollout-0-it2-cccc": ("w2", 50.0)},
                   silent={"w0": 0.2, "w1": 0.3, "w2": 0.1},
                   durations={"rollout": [1.0, 2.0, 4.0]})
    hangs = find_hangs(act, ["aaaa"], ["w0", "w1"], None, floor=10.0)
    assert [(h.key, h.bound) for h in hangs] == [("rollout-1-it3-aaaa", 20.0)]
    assert find_hangs(act, ["aaaa"], ["w0", "w1"], None, floor=40.0) == []  # bbbb: another run's
    # an earlier attempt's task still holds its worker's thread: it counts
    assert sorted(h.worker for h in find_hangs(act, ["cccc", "aaaa"], ["w0"], 25.0)) == ["w1", "w2"]


@pytest.mark.parametrize("victim", [0, 1], ids=["learner-worker", "rollout-worker"])
def test_a_worker_stopped_with_sigstop_is_restarted_and_the_run_recovers(tmp_path: Path,
                                                                         victim: int) -> None:
    out, log = tmp_path / "run", tmp_path / "train.log"
    train = _train(tmp_path, "graphs/ppo.py", out,
                   ["--workers", "2", "--task-timeout", TIMEOUT, *PPO_SMALL])
    try:
        _wait_rows(train, out, log, 3)
        # w0 holds the learner and rollout replica 0, w1 rollout replica 1
        os.kill(_worker_processes(train, 2)[victim], signal.SIGSTOP)
        text = _finished(train, log, limit=180)
    finally:
        _stop([train])
    rows = _check_metrics(out)  # every iteration once, in order, env steps counted once
    assert f"daskrl: hang: worker 'w{victim}' has not answered for" in text, text[-3000:]
    assert "did not answer for its stack" not in text, text[-3000:]  # not asked: frozen
    if victim == 0:
        assert rows[2]["learner_worker"] == "w0", rows[2]
    assert "lost (" in text, text[-3000:]
    assert "daskrl/cli.py" not in text, text[-3000:]  # no traceback of the driver's own
    # (Dask's logs may show one of a worker-to-worker transfer the stopped worker broke)


def test_a_fragment_stuck_in_an_env_step_is_reported_with_its_stack(tmp_path: Path) -> None:
    graph = tmp_path / "stuck.py"
    graph.write_text((ROOT / "graphs" / "ppo.py").read_text()
                     + STUCK.format(marker=str(tmp_path / "stuck-once"), again=None))
    out, log = tmp_path / "run", tmp_path / "train.log"
    train = _train(tmp_path, str(graph), out,
                   ["--workers", "2", "--task-timeout", TIMEOUT, *PPO_SMALL])
    try:
        text = _finished(train, log, limit=180)
    finally:
        _stop([train])
    assert (tmp_path / "stuck-once").exists()  # it did get stuck
    _check_metrics(out)
    report = text[text.index("daskrl: hang: task rollout-"):]
    assert f"(bound {TIMEOUT} s)" in report.splitlines()[0], report[:2000]
    assert "its stack on the worker:" in report, report[:2000]
    stack = report[report.index("its stack on the worker:"):report.index("daskrl: hang: worker")]
    assert "in rollout" in stack and "in step" in stack, stack  # where it hangs
    assert "threadpoolexecutor" not in stack, stack  # from the fragment's call on


def test_hangs_past_max_recoveries_stop_the_run_in_one_line(tmp_path: Path) -> None:
    # iteration 1 finishes; then every attempt hangs before its first iteration does
    graph = tmp_path / "stuck.py"
    graph.write_text((ROOT / "graphs" / "ppo.py").read_text()
                     + STUCK.format(marker=str(tmp_path / "stuck"), again=20))
    out, log = tmp_path / "run", tmp_path / "train.log"
    train = _train(tmp_path, str(graph), out,
                   ["--workers", "2", "--task-timeout", "8", "--max-recoveries", "1",
                    *PPO_SMALL])
    try:
        code = train.wait(timeout=150)
    finally:
        _stop([train])
    text = log.read_text()
    assert code == 2, text[-3000:]
    errors = [line for line in text.splitlines() if line.startswith("daskrl: error:")]
    assert len(errors) == 1, text[-3000:]
    assert "giving up after --max-recoveries 1" in errors[0], errors[0]
    done = len(_rows(out / "metrics.csv"))
    assert 1 <= done < ITERATIONS
    assert f"iteration {done} is checkpointed in {out / 'checkpoints'}" in errors[0], errors[0]
    assert [p.name for p in list_checkpoints(out / "checkpoints")][-1] == f"ckpt-{done:08d}.pt"
    assert "daskrl/cli.py" not in text, text[-3000:]  # no traceback of the driver's own
    # (Dask's logs may show one of a worker-to-worker transfer the stopped worker broke)


def _iterations(count: int, seconds: float, report: bool) -> int:
    """A fused task's stand-in: ``count`` iterations of ``seconds`` each, reporting progress
    after each but the last (as ``chained`` does) when ``report``."""
    import time

    from daskrl.core.worker_state import report_progress

    for j in range(count):
        time.sleep(seconds)
        if report and j < count - 1:
            report_progress()
    return count


def test_a_task_of_many_iterations_is_timed_from_its_last_progress(tmp_path: Path) -> None:
    """A task fusing iterations whose cost grew (learning began once a replay filled) is not
    a hang while each iteration finishes within the bound; one silent for as long is."""
    import time

    from distributed import Client, LocalCluster

    from daskrl.runtime.dask_backend import DaskBackend

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                      dashboard_address=None) as cluster, Client(cluster) as client:
        backend = DaskBackend(client)
        fused = client.submit(_iterations, 6, 0.75, True, key="learner-0-it0-aaaa")
        silent = client.submit(_iterations, 1, 4.5, False, key="learner-0-it0-bbbb")
        time.sleep(3.5)
        running = {k: s for k, (_, s) in backend.activity().running.items()}
        # each iteration 0.75 s: the fused task's clock restarts at each of its reports
        assert running["learner-0-it0-aaaa"] < 2.0, running
        assert running["learner-0-it0-bbbb"] > 2.5, running
        hangs = find_hangs(backend.activity(), ["aaaa", "bbbb"], [], timeout=2.5)
        assert [h.key for h in hangs] == ["learner-0-it0-bbbb"], hangs
        assert fused.result() == 6 and silent.result() == 1
        clock = client.run_on_scheduler(
            lambda dask_scheduler: dict(dask_scheduler.plugins["daskrl-task-clock"].progressed))
        assert clock == {}  # a finished task's reports are let go of
