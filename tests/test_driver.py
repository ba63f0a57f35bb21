"""The driver's loop against a fake backend (no cluster): look-ahead, grouping, recovery, resume.

:class:`FakeBackend` implements the Backend protocol in this process. A graph runs when the
driver asks for its result (so that graphs really are in flight meanwhile) on Dask's
synchronous scheduler; every iteration takes exactly 0.125 s of the tasks' own clock, so
the task sizes the driver picks are exact. A lost worker is simulated as the scheduler
would report it: a departure on the backend's membership and a new address for its name.
"""

from __future__ import annotations

import csv
from collections.abc import Callable, Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import dask
import pytest
import torch
from dask.delayed import Delayed, delayed
from distributed.scheduler import KilledWorker

from daskrl import Algorithm
from daskrl.core.algorithm import LearnerOutput
from daskrl.core.fragment import Fragment
from daskrl.distributions import Distribution, IterationInputs
from daskrl.runtime.checkpoint import list_checkpoints
from daskrl.runtime.driver import RunSettings, train
from daskrl.runtime.membership import Membership
from daskrl.runtime.run_loop import Phase, RunLoop, WorkersLost

pytestmark = pytest.mark.timeout(30)

TICK = 0.125  # seconds per iteration on the tasks' clock (exact in binary)
STEPS = 10  # env steps per iteration (num_steps * num_envs below)


class FakeLearner:
    def state_dict(self) -> dict[str, Any]:
        return {"model": self.weights()}

    def weights(self) -> dict[str, torch.Tensor]:
        return {"w": torch.zeros(1)}


ALGO = Algorithm("fake", make_actor=print, make_learner=lambda seed, device: FakeLearner(),
                 evaluate=print, num_steps=5, num_envs=2)


def _iterate(learner_in: LearnerOutput, first: int, count: int) -> LearnerOutput:
    """``count`` iterations from ``first``: the version counts iterations done."""
    assert learner_in.version == first, (learner_in.version, first)  # the right input
    history = []
    for it in range(first, first + count):
        history.append({"env_steps": STEPS, "rollout_t_start": it * TICK,
                        "learn_t_start": (it + 0.5) * TICK, "learn_t_end": (it + 1) * TICK,
                        "losses/loss": 1.0 / (it + 1)})
    done = first + count
    weights = {"w": torch.full((1,), float(done))}
    return LearnerOutput(done, {"model": weights}, weights, history[-1],
                         history=history[:-1])


class Counting(Distribution):
    """One learner task per graph, running up to ``cap`` iterations."""

    name = "counting"

    def __init__(self, cap: int = 1) -> None:
        self.cap = cap
        self.graphs: list[tuple[int, int, str]] = []  # (first, count, run) as built

    def fragments(self, algo: Algorithm) -> list[Fragment]:
        return [Fragment(_iterate, "learner", algo.resources_for("learner"))]

    def iteration(self, inputs: IterationInputs) -> Delayed:
        self.graphs.append((inputs.iteration, inputs.count, inputs.run))
        return delayed(_iterate, pure=False)(
            inputs.learner_in, inputs.iteration, inputs.count,
            dask_key_name=f"learner-it{inputs.iteration}-{inputs.run}")

    def iterations_per_task(self, inputs: IterationInputs) -> int:
        return self.cap


class FakeHandle:
    def __init__(self, backend: FakeBackend, graph: Delayed, first: int) -> None:
        self.backend, self.graph, self.first = backend, graph, first
        self.status = "pending"
        self.value: Any = None
        self.error: BaseException | None = None

    def exception(self, timeout: float | None = None) -> BaseException | None:
        return self.error

    def result(self, timeout: float | None = None) -> Any:
        if self.status == "released":
            raise AssertionError("the driver asked for a released graph")
        if self.status == "pending":
            fail = self.backend.fail_at.pop(self.first, None)
            if fail is not None:
                self.status, self.error = "error", fail
                raise fail
            with dask.config.set(scheduler="sync"):
                self.value = self.graph.compute()
            self.status = "finished"
        return self.value

    def cancel(self) -> None:
        raise AssertionError("the driver must release, not cancel")

    def release(self) -> None:
        if self.status == "pending":
            self.status = "released"


class FakeBackend:
    """An in-process Backend whose workers ``names`` can be lost and restarted.

    ``lose_at``: iterations whose graph loses worker ``a`` while the driver waits for it
    (each once, or every time with ``lose_always``); ``fail_at``: iteration -> exception its
    graph raises; ``scatter_lost_at``: versions whose scatter finds worker ``a`` dead (once).
    """

    name = "fake"
    watched = False  # every graph runs in this process: no watchdog

    def __init__(self, names: tuple[str, ...] = ("a",), lose_at: tuple[int, ...] = (),
                 lose_always: bool = False,
                 fail_at: Mapping[int, BaseException] | None = None,
                 scatter_lost_at: tuple[int, ...] = ()) -> None:
        self.membership = Membership()
        self.scatter_lost_at = set(scatter_lost_at)
        self.addresses = {name: f"fake://{name}-0" for name in names}
        self.lose_at, self.lose_always = set(lose_at), lose_always
        self.fail_at = dict(fail_at or {})
        self.handles: list[FakeHandle] = []
        self.max_in_flight = 0
        self.scattered: list[Any] = []
        self.identity_calls = 0
        self.checked: list[Delayed] = []
        self.everywhere: list[tuple[Callable[..., Any], tuple[Any, ...]]] = []
        self.published: list[tuple[str, Any]] = []

    def in_flight(self) -> int:
        return sum(h.status == "pending" for h in self.handles)

    def lose(self, name: str) -> None:
        """Worker ``name`` dies and its nanny starts it again at a new address."""
        old = self.addresses[name]
        self.membership.on_event((0.0, {"action": "remove-worker", "worker": old}))
        self.addresses[name] = f"{old.rsplit('-', 1)[0]}-{int(old.rsplit('-', 1)[1]) + 1}"
        self.membership.on_event((0.0, {"action": "add-worker",
                                        "worker": self.addresses[name]}))

    # the Backend protocol

    def workers(self, fragments: list[Fragment]) -> dict[str, Mapping[str, float]]:
        return {name: {"CPU": 4} for name in self.addresses}

    def scatter(self, value: Any, worker: str | None) -> Any:
        if value.version in self.scatter_lost_at:
            self.scatter_lost_at.discard(value.version)
            self.lose("a")
            raise WorkersLost(f"worker {worker} did not take the input sent to it")
        self.scattered.append(value)
        return value

    def submit(self, graph: Delayed) -> FakeHandle:
        first = int(str(graph.key).split("-")[1][2:]) if "-it" in str(graph.key) else -1
        handle = FakeHandle(self, graph, first)
        self.handles.append(handle)
        self.max_in_flight = max(self.max_in_flight, self.in_flight())
        return handle

    def as_input(self, handle: FakeHandle) -> Any:
        return delayed(handle.result, pure=False)()

    def fetch(self, handle: FakeHandle, timeout: float) -> Any:
        return handle.result(timeout)

    def done(self, handle: FakeHandle, timeout: float) -> bool:
        if handle.first in self.lose_at:
            if not self.lose_always:
                self.lose_at.discard(handle.first)
            self.lose("a")
            return False
        return True

    def identities(self) -> dict[str, str]:
        self.identity_calls += 1
        return dict(self.addresses)

    def run_everywhere(self, fn: Callable[..., Any], *args: Any) -> None:
        self.everywhere.append((fn, args))

    def check_annotations(self, graph: Delayed) -> None:
        self.checked.append(graph)

    def memory_limits(self) -> dict[str, int | None]:
        return dict.fromkeys(self.addresses)

    def worker_environ(self, names: tuple[str, ...]) -> dict[str, dict[str, str | None]]:
        return {name: {n: "AUTO" for n in names} for name in self.addresses}

    def publish(self, topic: str, msg: Any) -> None:
        self.published.append((topic, msg))

    def task_stream(self, since: int | None) -> tuple[int, list[dict[str, Any]]]:
        return 0, []


def _settings(out: Path, iterations: int, **kwargs: Any) -> RunSettings:
    base = dict(steps=iterations * STEPS, lookahead=3, checkpoint_every=4, tensorboard=False,
                eval=False, progress=False, replan_timeout=2.0)
    return RunSettings(out, **{**base, **kwargs})


def _rows(out: Path) -> list[dict[str, str]]:
    with (out / "metrics.csv").open(newline="") as fh:
        return list(csv.DictReader(fh))


def _check_rows(out: Path, iterations: int) -> None:
    """Every iteration once, in order; env steps counted once per iteration."""
    rows = _rows(out)
    assert [int(r["iteration"]) for r in rows] == list(range(1, iterations + 1))
    assert [int(r["env_steps"]) for r in rows] == [STEPS * i for i in range(1, iterations + 1)]


# ------------------------------------------------------------------------- look-ahead


def test_lookahead_keeps_that_many_graphs_in_flight_each_chained_on_the_last(tmp_path):
    backend, dist = FakeBackend(), Counting()
    summary = train(backend, ALGO, dist, _settings(tmp_path, 12, lookahead=3))
    assert backend.max_in_flight == 3
    assert [g[:2] for g in dist.graphs] == [(i, 1) for i in range(12)]
    assert len(backend.scattered) == 1  # only the first graph starts from the driver's data
    assert len(backend.checked) == 1  # the first graph's annotations, once
    assert summary["iterations"] == 12 and summary["env_steps"] == 12 * STEPS
    _check_rows(tmp_path, 12)
    assert backend.identity_calls == 1  # pinned once: no question per wait
    assert [args for _, args in backend.everywhere] == [(dist.graphs[0][2],)]  # state dropped


def test_a_chain_at_its_length_drains_and_restarts_from_the_driver_copy(tmp_path):
    backend = FakeBackend()
    train(backend, ALGO, Counting(), _settings(tmp_path, 12, lookahead=2, chain=4))
    assert backend.max_in_flight == 2
    assert [s.version for s in backend.scattered] == [0, 4, 8]  # each chain: 4 graphs
    _check_rows(tmp_path, 12)


# ------------------------------------------------------------------------- grouping


def test_short_iterations_are_grouped_once_a_task_is_timed(tmp_path):
    backend, dist = FakeBackend(), Counting(cap=8)
    train(backend, ALGO, dist, _settings(tmp_path, 19, lookahead=2, task_s=4 * TICK))
    # one iteration alone (and alone in flight) to time it; then 4 per task, the rest last
    assert [g[:2] for g in dist.graphs] == [(0, 1), (1, 4), (5, 4), (9, 4), (13, 4), (17, 2)]
    assert backend.max_in_flight == 2
    _check_rows(tmp_path, 19)  # a row per iteration, not per task
    kept = sorted(int(p.stem.split("-")[1]) for p in list_checkpoints(tmp_path / "checkpoints"))
    assert kept == [13, 17, 19]  # a task that crosses a multiple of 4 is checkpointed


def test_grouping_is_capped_by_the_distribution_and_off_with_task_s_zero(tmp_path):
    dist = Counting(cap=3)
    train(FakeBackend(), ALGO, dist, _settings(tmp_path / "capped", 8, task_s=100.0))
    assert [g[:2] for g in dist.graphs] == [(0, 1), (1, 3), (4, 3), (7, 1)]
    dist = Counting(cap=3)
    train(FakeBackend(), ALGO, dist, _settings(tmp_path / "off", 4, task_s=0.0))
    assert [g[:2] for g in dist.graphs] == [(i, 1) for i in range(4)]


# ------------------------------------------------------------------------- recovery


@pytest.mark.parametrize("how", ["reported", "task-error"])
def test_an_iteration_lost_with_a_worker_is_resubmitted_from_the_last_finished(tmp_path, how,
                                                                             capsys):
    if how == "reported":  # the scheduler reports the pinned worker gone
        backend = FakeBackend(lose_at=(5,))
    else:  # the task itself fails as lost
        lost = KilledWorker("learner-it5", SimpleNamespace(address="fake://a-0"), 3)
        backend = FakeBackend(fail_at={5: lost})
    dist = Counting()
    summary = train(backend, ALGO, dist, _settings(tmp_path, 10, lookahead=3))
    firsts = [g[0] for g in dist.graphs]
    assert firsts[:8] == [0, 1, 2, 3, 4, 5, 6, 7]  # 5, 6 and 7 were in flight
    assert firsts[8:] == [5, 6, 7, 8, 9]  # resubmitted from iteration 5's input
    runs = [g[2] for g in dist.graphs]
    assert len(set(runs[:8])) == 1 and len(set(runs[8:])) == 1 and runs[0] != runs[8]
    assert [s.version for s in backend.scattered] == [0, 5]  # from the driver's copy
    assert sum(h.status == "released" for h in backend.handles) == 2 + (how == "reported")
    assert backend.identity_calls == 2  # pinned again on the restarted worker
    _check_rows(tmp_path, 10)
    assert summary["env_steps"] == 10 * STEPS
    assert [args[0] for _, args in backend.everywhere] == [runs[0], runs[8]]
    assert "daskrl: iteration 6 lost" in capsys.readouterr().err


def test_a_worker_lost_while_the_chain_restarts_is_recovered_from(tmp_path, capsys):
    """The learner's worker can die as the driver sends it the chain's first input, when
    nothing is in flight: the run places again and goes on from that input."""
    backend, dist = FakeBackend(scatter_lost_at=(4,)), Counting()
    train(backend, ALGO, dist, _settings(tmp_path, 12, lookahead=2, chain=4))
    assert [s.version for s in backend.scattered] == [0, 4, 8]
    runs = [g[2] for g in dist.graphs]
    assert [g[0] for g in dist.graphs] == list(range(12))  # nothing was lost or redone
    assert len(set(runs[:4])) == 1 and len(set(runs[4:])) == 1 and runs[0] != runs[4]
    assert backend.identity_calls == 2  # pinned again on the restarted worker
    _check_rows(tmp_path, 12)
    assert "daskrl: iteration 5 lost (worker" in capsys.readouterr().err


def test_recovery_gives_up_after_max_recoveries_and_keeps_the_last_iteration(tmp_path):
    backend = FakeBackend(lose_at=(2,), lose_always=True)
    with pytest.raises(RuntimeError, match="iteration 3 was lost 3 times"):
        train(backend, ALGO, Counting(), _settings(tmp_path, 6, max_recoveries=2))
    assert backend.identity_calls == 3  # the first placement and two recoveries
    assert [int(r["iteration"]) for r in _rows(tmp_path)] == [1, 2]
    kept = [int(p.stem.split("-")[1]) for p in list_checkpoints(tmp_path / "checkpoints")]
    assert kept == [2]  # the last finished iteration, checkpointed on the way out


def test_a_worker_that_does_not_come_back_stops_the_run_with_a_clear_error(tmp_path):
    class Shrinking(FakeBackend):
        def lose(self, name: str) -> None:  # no nanny: the worker stays gone
            self.membership.on_event((0.0, {"action": "remove-worker",
                                            "worker": self.addresses.pop(name)}))

    backend = Shrinking(lose_at=(1,))
    with pytest.raises(ValueError, match="the cluster lost the workers this run needs"):
        train(backend, ALGO, Counting(), _settings(tmp_path, 4, replan_timeout=0.2))


# ------------------------------------------------------------------------- resume


class TimingOutFetch(FakeBackend):
    """A fetch that times out on an event loop too busy to answer, the task failed meanwhile."""

    def fetch(self, handle: FakeHandle, timeout: float) -> Any:
        try:
            return handle.result(timeout)
        except ValueError:
            raise TimeoutError("the fetch timed out") from None


def test_a_failed_task_raises_its_own_error_not_the_fetch_s_timeout(tmp_path):
    backend = TimingOutFetch(fail_at={2: ValueError("iteration 3 found a NaN")})
    with pytest.raises(ValueError, match="found a NaN"):
        train(backend, ALGO, Counting(), _settings(tmp_path, 5))


def test_resume_starts_from_the_checkpoint_and_continues_the_metrics(tmp_path):
    backend, dist = FakeBackend(fail_at={6: KeyboardInterrupt()}), Counting()
    with pytest.raises(KeyboardInterrupt):  # Ctrl-C while iteration 7 computes
        train(backend, ALGO, dist, _settings(tmp_path, 10, checkpoint_every=4))
    assert [int(r["iteration"]) for r in _rows(tmp_path)] == [1, 2, 3, 4, 5, 6]
    assert all(h.status != "pending" for h in backend.handles)  # nothing left in flight
    first_rows = _rows(tmp_path)
    backend, dist = FakeBackend(), Counting()
    summary = train(backend, ALGO, dist, _settings(tmp_path, 10, resume=True))
    assert dist.graphs[0][0] == 6  # the Ctrl-C checkpoint, not the periodic one at 4
    start = backend.scattered[0]
    assert start.version == 6 and start.weights["w"].item() == 6.0
    _check_rows(tmp_path, 10)
    rows = _rows(tmp_path)
    assert rows[:6] == first_rows
    walls = [float(r["wall_s"]) for r in rows]
    assert walls == sorted(walls)  # the wall clock continues from the checkpoint's counter
    assert summary["env_steps"] == 10 * STEPS


# ------------------------------------------------------------------------- phases


def test_the_loop_steps_through_named_phases(tmp_path):
    from daskrl.runtime.recorder import Recorder
    from daskrl.runtime.run_loop import Attempt, place

    backend, dist = FakeBackend(lose_at=(1,)), Counting()
    settings = _settings(tmp_path, 3, lookahead=2)
    attempt = Attempt.begin(backend, ALGO, dist, place(backend, ALGO, dist), settings)
    recorder = Recorder(tmp_path, 3, 0, {}, tensorboard=False)
    loop = RunLoop(backend, ALGO, dist, settings, attempt, recorder,
                   LearnerOutput(0, FakeLearner().state_dict(), FakeLearner().weights()), 0, 3)
    seen = [loop.phase]
    while loop.phase is not Phase.DONE:
        loop.phase = {Phase.SUBMITTING: loop.submit, Phase.WAITING: loop.wait,
                      Phase.RECOVERING: loop.recover}[loop.phase]()
        seen.append(loop.phase)
    recorder.close()
    S, W, R, D = Phase.SUBMITTING, Phase.WAITING, Phase.RECOVERING, Phase.DONE
    assert seen == [S, W, S, W, R, S, W, S, W, S, D]
    assert loop.last_done.version == 3 and loop.recoveries == 1
