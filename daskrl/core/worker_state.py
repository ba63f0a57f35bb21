"""Worker-resident state (vector envs, policy copies, learners) that lives across iterations.

Objects are keyed by ``(run, role, replica)``, created lazily by a factory the first time a
task on a worker asks for them, and rebuilt from their seeds when a replica lands on a worker
that does not hold them (a fresh or replacement worker). They live in a
:class:`ResidentState` worker plugin (``Client.register_plugin``), never in ``worker.data``
(which Dask spills and moves); the plugin closes them when its worker closes. Tasks of
consecutive iterations that step the same object take it in iteration order
(:func:`in_turn`). Outside a Dask worker (``--scheduler sync``) one in-process store serves.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from typing import Any, ClassVar, TypeVar

from distributed import Client, Reschedule, Worker, WorkerPlugin, get_client, get_worker

from daskrl.compat import quiet_heartbeat_at_close

T = TypeVar("T")

PLUGIN_NAME = "daskrl-resident"
"""The name :class:`ResidentState` is registered under on every worker."""
TURN_WAIT_S = 120.0
"""How long :func:`in_turn` waits for an earlier iteration that has not run."""
TURN_RETRY_S = 0.005
"""Pause before a task out of turn goes back to the scheduler."""


class ResidentState(WorkerPlugin):
    """One worker's resident objects, closed (``obj.close()``) when the worker closes.

    Register it once per cluster with :func:`register`; a worker that joins later gets it
    when it connects.

    Examples
    --------
    >>> state = ResidentState()
    >>> state.setup(None)
    >>> state.objects["k"] = []
    >>> state.teardown(None)
    >>> state.objects
    {}
    """

    idempotent: ClassVar[bool] = True  # registering again keeps the objects built

    def __init__(self) -> None:
        self.objects: dict[Hashable, Any] = {}
        self.lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        return {}  # sent to the workers empty: each builds its own

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__()

    def setup(self, worker: Worker | None) -> None:
        """Start with no objects; a heartbeat cut by the worker's own close is not logged
        as an error (:func:`daskrl.compat.quiet_heartbeat_at_close`)."""
        self.objects.clear()
        quiet_heartbeat_at_close()

    def teardown(self, worker: Worker | None) -> None:
        """Close every object (envs hold processes, files and sockets)."""
        with self.lock:
            objects = list(self.objects.values())
            self.objects.clear()
        for obj in objects:
            _close(obj)


_LOCAL = ResidentState()  # outside a Dask worker (synchronous scheduler)


def register(client: Client) -> None:
    """Give every worker of ``client``'s cluster, and every one that joins, a
    :class:`ResidentState` (once: registering again keeps what workers hold).

    Examples
    --------
    >>> register(client)  # doctest: +SKIP
    """
    client.register_plugin(ResidentState(), name=PLUGIN_NAME)


def _current_worker() -> Worker | None:
    try:
        return get_worker()
    except ValueError:  # not in a task on a worker
        return None


def _state(worker: Worker | None = None) -> ResidentState:
    if worker is None:
        worker = _current_worker()
        if worker is None:
            return _LOCAL
    plugin = worker.plugins.get(PLUGIN_NAME)
    if plugin is None:  # a cluster nobody registered it on: this task registers it
        get_client().register_plugin(ResidentState(), name=PLUGIN_NAME)
        deadline = time.monotonic() + 30
        # a task on another worker may have registered it first: its copy is on the way
        while (plugin := worker.plugins.get(PLUGIN_NAME)) is None:
            if time.monotonic() > deadline:
                raise RuntimeError(f"worker {worker.name}: {PLUGIN_NAME} was registered but "
                                   "did not arrive within 30 s")
            time.sleep(0.01)
    return plugin


_pools: list[Any] = []  # [controller, len(sys.modules) when it was made]


def _controller() -> Any:
    """This process's threadpoolctl controller, looked up again when modules were imported
    since: an import can load another BLAS (scipy ships its own OpenBLAS), which a
    controller made before it would not limit."""
    if not _pools or _pools[1] != len(sys.modules):
        from threadpoolctl import ThreadpoolController

        _pools[:] = [ThreadpoolController(), len(sys.modules)]
    return _pools[0]


def limit_threads(threads: int) -> None:
    """Run torch's intra-op pool and the BLAS/OpenMP pools of this process
    (``threadpoolctl``) with at most ``threads`` threads.

    A task calls it with its CPU grant (:attr:`~daskrl.core.resources.Resources.threads`)
    before its fragment runs. torch and numpy size their pools to every core of the machine
    when they load, unless ``OMP_NUM_THREADS`` says otherwise; Dask's nanny and daskrl's
    fork server set it to 1 for the workers they start, but ``dask worker --no-nanny``,
    thread workers and ``--scheduler sync`` run in processes that did not, where every task
    would use every core, oversubscribing the cores the other tasks run on. The libraries
    are looked up once per process (a ``ThreadpoolController``), and again only after new
    imports, so a task pays microseconds. Every BLAS pool (numpy's, and any other a library
    loads, e.g. scipy's) is held at one thread: fragments do their heavy maths in torch, and
    OpenBLAS ignores a lower count asked from one thread once another thread raised it, so a
    grant of 2 followed by a grant of 1 would keep 2.

    Examples
    --------
    >>> import torch
    >>> before = torch.get_num_threads()
    >>> limit_threads(1)
    >>> torch.get_num_threads()
    1
    >>> limit_threads(before)
    """
    import torch

    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    _controller().limit(limits=1, user_api="blas")


_driver = threading.Event()  # set where a driver runs: tasks there put back the counts
_running = 0  # tasks in this process inside task_threads, for the driver process's BLAS
_found_blas: list[tuple[Any, int]] = []  # (its controller, count) before the first of them
_running_lock = threading.Lock()


def mark_driver_process() -> None:
    """Note that a driver runs in this process, so tasks here put the caller's thread counts
    back once they end (:func:`task_threads`).

    Each backend calls it: ``--scheduler sync`` runs tasks in the caller's own thread, and
    thread workers (``LocalCluster(processes=False)``) in the caller's process, whose BLAS
    pool all its threads share.
    """
    _driver.set()


def _blas_pools() -> list[tuple[Any, int]]:
    """This process's BLAS pools and their thread counts now."""
    return [(lib, lib.num_threads) for lib in _controller().select(user_api="blas").lib_controllers]


@contextmanager
def task_threads(threads: int) -> Iterator[None]:
    """Run the body as a task with a CPU grant of ``threads`` (:func:`limit_threads`); 0
    leaves the counts as they are (a call inside a task keeps its task's).

    In a driver's process (:func:`mark_driver_process`) the counts the caller had come back
    afterwards: torch's for the thread that ran the task (its OpenMP count is the thread's
    own), the BLAS pools' (one for the whole process) once the last task running here ends,
    so a task in flight keeps its grant. A notebook that trains on thread workers, or with
    ``--scheduler sync``, keeps its own torch and numpy speed. Worker processes keep the
    grant between tasks: nothing else runs there, and setting it again costs time.

    Examples
    --------
    >>> import torch
    >>> before = torch.get_num_threads()
    >>> mark_driver_process()
    >>> with task_threads(1):
    ...     torch.get_num_threads()
    1
    >>> torch.get_num_threads() == before
    True
    """
    global _running
    if not threads:
        yield
        return
    if not _driver.is_set():
        limit_threads(threads)
        yield
        return
    import torch

    torch_before = torch.get_num_threads()
    with _running_lock:
        if _running == 0:
            _found_blas[:] = _blas_pools()
        _running += 1
    try:
        limit_threads(threads)
        yield
    finally:
        if torch.get_num_threads() != torch_before:
            torch.set_num_threads(torch_before)
        with _running_lock:
            _running -= 1
            if _running == 0:
                for lib, count in _found_blas:
                    if lib.num_threads != count:
                        lib.set_num_threads(count)


def worker_name() -> str:
    """Name of the Dask worker running the caller, or ``"local"`` outside a worker.

    Examples
    --------
    >>> worker_name()
    'local'
    """
    worker = _current_worker()
    return "local" if worker is None else str(worker.name)


PROGRESS_TOPIC = "daskrl-progress"
"""The scheduler event a task sends each time it finishes a part of its work."""


def report_progress() -> None:
    """Tell the scheduler that the running task finished a part of its work (one iteration
    of several fused in one task): the watchdog bounds the time since a task's last
    progress, not since its start, so a task of many iterations whose cost grew (learning
    started after a replay filled) is not taken for a hung one. Outside a worker: nothing.

    Examples
    --------
    >>> report_progress()  # not in a task on a worker
    """
    worker = _current_worker()
    if worker is None:
        return
    try:
        key = worker.get_current_task()
    except KeyError:  # a thread of the worker that runs no task
        return
    worker.log_event(PROGRESS_TOPIC, str(key))


def resident(key: Hashable, build: Callable[[], T]) -> tuple[T, bool]:
    """Return the object stored under ``key`` on this worker, building it if absent.

    Returns
    -------
    obj, built : (object, bool)
        ``built`` is True when the object was created by this call.

    Examples
    --------
    >>> obj, built = resident(("run", "rollout", 0), lambda: [1, 2])
    >>> built, resident(("run", "rollout", 0), list)[1]
    (True, False)
    >>> drop_run("run")
    1
    """
    state = _state()
    with state.lock:
        if key in state.objects:
            return state.objects[key], False
        obj = build()
        state.objects[key] = obj
        return obj, True


def drop_key(key: Hashable) -> bool:
    """Forget (and close) the object under ``key`` on this worker; whether there was one.

    Examples
    --------
    >>> _ = resident(("run", "rollout", 1), list)
    >>> drop_key(("run", "rollout", 1)), drop_key(("run", "rollout", 1))
    (True, False)
    """
    state = _state()
    with state.lock:
        obj = state.objects.pop(key, None)
    if obj is not None:
        _close(obj)
    return obj is not None


def _close(obj: Any) -> None:
    closer = getattr(obj, "close", None)
    if callable(closer):
        try:
            closer()
        except Exception:  # noqa: BLE001 - best effort clean-up
            pass


def drop_run(run: str, dask_worker: Worker | None = None) -> int:
    """Forget every object of ``run`` on this worker; returns how many.

    Call it on every worker at the end of a run with ``client.run(drop_run, run)``, which
    passes the worker as ``dask_worker`` (``get_worker()`` works only inside tasks).
    """
    state = _state() if dask_worker is None else dask_worker.plugins.get(PLUGIN_NAME)
    if state is None:  # no task of daskrl ran on this worker
        return 0
    with state.lock:
        objects = [state.objects.pop(k) for k in list(state.objects)
                   if isinstance(k, tuple) and k and k[0] == run]
    for obj in objects:
        _close(obj)
    return len(objects)


class _Turns:
    """The latest iteration of one resident object that ran on this worker."""

    def __init__(self) -> None:
        self.done: int | None = None
        self.since: dict[int, float] = {}  # iteration -> when it first came out of turn


class OutOfTurn(RuntimeError):
    """A deterministic run's task would step its resident object out of iteration order."""


@contextmanager
def in_turn(key: tuple[Hashable, ...], iteration: int, after: int | None,
            wait_s: float = TURN_WAIT_S, strict: bool = False) -> Iterator[None]:
    """Run the body as iteration ``iteration`` of the resident object ``key`` once
    iteration ``after`` of it ran on this worker (at once when ``after`` is None).

    Two tasks that step the same envs (one-step-stale rollouts of consecutive iterations)
    can be ready at once, and a worker may start the later one first. A task that comes
    out of turn hands itself back to the scheduler (``distributed.Reschedule``), which
    frees its thread and resources for the earlier one and sends it again. If iteration
    ``after`` has not run within ``wait_s`` (it was lost with its run), the body runs
    anyway, with a note on stderr; with ``strict`` (a deterministic run, whose envs must
    step in one order) it raises :class:`OutOfTurn` instead. Outside a Dask worker tasks
    run in order: no check.

    Examples
    --------
    >>> with in_turn(("doc", "rollout", 0), 0, None):
    ...     pass
    >>> with in_turn(("doc", "rollout", 0), 1, after=0):  # iteration 0 ran: in turn
    ...     pass
    >>> drop_run("doc")
    1
    """
    turns, _ = resident((*key, "turn"), _Turns)
    if after is not None and (turns.done is None or turns.done < after) and (
            _current_worker() is not None):
        since = turns.since.setdefault(iteration, time.monotonic())
        if time.monotonic() - since < wait_s:
            time.sleep(TURN_RETRY_S)  # the earlier one may still be on its way
            raise Reschedule()
        turns.since.pop(iteration, None)
        if strict:
            raise OutOfTurn(
                f"{key}: iteration {after} did not run on worker {worker_name()} within "
                f"{wait_s:.0f} s, and a deterministic run cannot step these envs out of "
                f"order for iteration {iteration}; run without --deterministic, or find what "
                "held iteration "
                f"{after} back (`daskrl profile`, the dashboard's task stream)")
        print(f"daskrl: {key}: iteration {after} did not run within {wait_s:.0f} s; "
              f"running iteration {iteration} without it", file=sys.stderr)
    turns.since.pop(iteration, None)
    yield
    turns.done = iteration if turns.done is None else max(turns.done, iteration)
