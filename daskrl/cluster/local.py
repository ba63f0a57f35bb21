"""Clusters: the embedded local cluster, connecting to a scheduler, and resource checks."""

from __future__ import annotations

import contextlib
import os
import threading
import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import dask
from distributed import (
    Client,
    Future,
    LocalCluster,
    Security,
    SpecCluster,
    Status,
    Worker,
    fire_and_forget,
    wait,
)

from daskrl.cluster.forkserver import WORKER_DASK_ENV, worker_environ, worker_forkserver
from daskrl.cluster.upkeep import quiet_upkeep
from daskrl.compat import serve_dashboard_on_demand, set_new_workers
from daskrl.core.scheduler_workers import scheduler_workers
from daskrl.core.worker_state import register
from daskrl.observe.board import board_settings

DEFAULT_TIMEOUT = "30s"
"""How long a task may wait for a worker that offers its resources before it fails."""

@contextlib.contextmanager
def dask_settings(no_workers_timeout: str = DEFAULT_TIMEOUT) -> Iterator[None]:
    """Dask settings for the clusters daskrl starts, while they are made: no task waits
    forever, the workers' environment and config, the dashboard's daskrl page.

    ``distributed.scheduler.no-workers-timeout`` makes a task that no worker can run fail
    with ``NoValidWorkerError`` instead of waiting forever; nanny-started workers get
    :func:`~daskrl.cluster.forkserver.worker_environ` (threads, MKL, allocator) in their
    environment and :data:`~daskrl.cluster.forkserver.WORKER_DASK_ENV` in their config; a
    scheduler made here also serves the dashboard's daskrl page
    (:func:`~daskrl.observe.board.board_settings`). Schedulers and nannies read these when
    they are made, so the settings hold only inside the ``with``: a cluster the user starts
    afterwards gets Dask's defaults. (Low-level fusion, which would drop the tasks' resource
    annotations, is kept off per graph: ``DaskBackend.submit`` computes with
    ``optimize_graph=False``.)

    Examples
    --------
    >>> import dask
    >>> before = dask.config.get("distributed.scheduler.no-workers-timeout")
    >>> with dask_settings("5s"):
    ...     dask.config.get("distributed.scheduler.no-workers-timeout")
    '5s'
    >>> dask.config.get("distributed.scheduler.no-workers-timeout") == before
    True
    """
    # a worker process takes its nanny's config, not its environment
    worker_config = _dotted(dask.config.collect_env(
        {k: os.environ.get(k, v) for k, v in WORKER_DASK_ENV.items()}))
    with dask.config.set({
        **worker_config,
        "distributed.scheduler.no-workers-timeout": no_workers_timeout,
        "distributed.nanny.pre-spawn-environ": worker_environ(),
        **board_settings(dask.config.get("distributed.scheduler.http.routes")),
    }):
        yield


def _dotted(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested config as dotted keys, for ``dask.config.set`` (which replaces a nested
    value whole).

    Examples
    --------
    >>> _dotted({"a": {"b": {"c": 1}, "d": 2}})
    {'a.b.c': 1, 'a.d': 2}
    """
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, Mapping):
            out.update(_dotted(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def close_cluster(cluster: Any, connect_s: float = 2.0) -> None:
    """Close a cluster started here; one whose scheduler is gone closes in seconds.

    ``SpecCluster.close`` ends by sending the scheduler a ``terminate``; with the scheduler
    gone (a lost cluster about to be restarted), that connection retries for
    ``distributed.comm.timeouts.connect`` (30 s by default) before the close goes on. Here
    it gets ``connect_s``, through Dask's config (so for the length of the close any other
    connection this process opens gets it too). A cluster whose scheduler, which runs in
    this process, is still running closes as usual.

    Examples
    --------
    >>> cluster = local_cluster([{"CPU": 1}], processes=False, dashboard_address=None)
    >>> cluster.sync(cluster.scheduler.close)  # the scheduler goes away under the cluster
    >>> close_cluster(cluster)
    >>> cluster.status.name
    'closed'
    """
    if cluster.scheduler.status == Status.running:
        cluster.close()
        return
    with dask.config.set({"distributed.comm.timeouts.connect": f"{connect_s}s"}):
        cluster.close()


def local_cluster(
    worker_resources: Sequence[Mapping[str, float]],
    threads_per_worker: int = 1,
    processes: bool = True,
    dashboard_address: str = "127.0.0.1:0",
    security: bool | None = None,
) -> LocalCluster:
    """An embedded cluster on 127.0.0.1 with one worker per entry of ``worker_resources``.

    Workers are named ``w0, w1, ...`` (names, unlike addresses, survive restarts) and each
    advertises its own resources, e.g. ``[{"CPU": 1}, {"CPU": 1, "GPU": 1}]``.
    The dashboard's pages are imported when the first one is requested
    (:func:`daskrl.compat.serve_dashboard_on_demand`); ``dashboard_address=None`` starts
    no dashboard.

    Examples
    --------
    >>> cluster = local_cluster([{"CPU": 1}], processes=False)  # doctest: +SKIP
    """
    with dask_settings():
        cluster = LocalCluster(
            n_workers=0,
            threads_per_worker=threads_per_worker,
            processes=processes,
            host="127.0.0.1",
            dashboard_address=dashboard_address,
            security=security or None,
            scheduler_kwargs={"dashboard": False},
            # in-process workers default to the inproc protocol, which takes no host
            **({} if processes or security else {"protocol": "tcp://"}),
        )
    if dashboard_address:
        serve_dashboard_on_demand(cluster.scheduler)
    add_workers(cluster, worker_resources)
    return cluster


def sync_workers(cluster: SpecCluster) -> None:
    """Start or stop workers until ``cluster`` runs what its ``worker_spec`` says, and
    wait for that (what awaiting a ``SpecCluster`` does); errors starting one are raised.

    Examples
    --------
    >>> cluster = local_cluster([{"CPU": 1}, {"CPU": 1}], processes=False)  # doctest: +SKIP
    >>> del cluster.worker_spec["w1"]  # doctest: +SKIP
    >>> sync_workers(cluster)  # doctest: +SKIP
    """
    cluster.sync(_awaited, cluster)


async def _awaited(cluster: SpecCluster) -> SpecCluster:
    return await cluster


def add_workers(cluster: LocalCluster, worker_resources: Sequence[Mapping[str, float]]) -> None:
    """Start more workers on a :func:`local_cluster`, named on from its last one.

    Examples
    --------
    >>> cluster = local_cluster([{"CPU": 1}], processes=False)  # doctest: +SKIP
    >>> add_workers(cluster, [{"CPU": 1}])  # doctest: +SKIP
    >>> sorted(cluster.worker_spec)  # doctest: +SKIP
    ['w0', 'w1']
    """
    # the spec of a worker scale() would add: its class and LocalCluster's options
    (template,) = cluster.new_worker_spec().values()
    cls, base = template["cls"], dict(template["options"])
    taken = [int(n[1:]) for n in cluster.worker_spec
             if str(n)[:1] == "w" and str(n)[1:].isdigit()]
    first = max(taken, default=-1) + 1  # after the last one: a lost worker's name stays free
    for i, res in enumerate(worker_resources, first):
        cluster.worker_spec[f"w{i}"] = {"cls": cls,
                                        "options": {**base, "resources": dict(res)}}
    if worker_resources:
        # thread workers (no nanny) share this process and its event loop, where their
        # upkeep adds up (daskrl.cluster.upkeep); they read the settings as they start
        with dask_settings(), quiet_upkeep() if cls is Worker else contextlib.nullcontext():
            sync_workers(cluster)


def scale_like(cluster: LocalCluster, resources: Mapping[str, float]) -> None:
    """Make ``cluster.scale`` (and Dask's adaptive scaling, which calls it) start workers
    the way :func:`add_workers` does: named on from the last one, each advertising
    ``resources``.

    Examples
    --------
    >>> cluster = local_cluster([{"CPU": 1}], processes=False)  # doctest: +SKIP
    >>> scale_like(cluster, {"CPU": 1}); cluster.scale(2)  # doctest: +SKIP
    >>> sorted(cluster.worker_spec)  # doctest: +SKIP
    ['w0', 'w1']
    """
    (template,) = cluster.new_worker_spec().values()
    set_new_workers(cluster, {"cls": template["cls"],
                              "options": {**template["options"], "resources": dict(resources)}},
                    lambda i: f"w{i}")


class ClusterStart:
    """The embedded cluster, started in a thread with its first worker while the driver is
    still importing torch and the graph script; :meth:`take` adds the other workers.

    Where the platform has one, its workers are forked from a server process that has
    already imported what tasks need (:func:`worker_forkserver`), started before anything
    else; elsewhere the first worker runs :func:`warm_imports` as a task while the driver
    builds the first iteration.

    Examples
    --------
    >>> start = ClusterStart(security=None)  # doctest: +SKIP
    >>> cluster, client = start.take(workers=2)  # doctest: +SKIP
    """

    def __init__(self, security: bool | None = None) -> None:
        self.cluster: LocalCluster | None = None
        self.client: Client | None = None
        self.error: BaseException | None = None
        self.warm: Future | None = None
        self.taken = False
        self.method = worker_forkserver()
        # here, not in the thread: on a GPU machine this imports torch, and two threads
        # importing torch at once can each see the other's half-imported modules
        first = default_worker_resources(1)
        self._thread = threading.Thread(target=self._start, args=(security, first),
                                         name="daskrl-cluster-start", daemon=True)
        self._thread.start()

    def _start(self, security: bool | None, first: list[dict[str, float]]) -> None:
        try:
            with self._spawning():
                self.cluster = local_cluster(first, security=security)
            self.client = Client(self.cluster)
            register(self.client)
            if self.method is None:  # spawned: the worker has imported nothing yet
                # a task, not Client.run: the worker's event loop stays free to answer (and
                # to close quickly when the run is refused)
                self.warm = self.client.submit(warm_imports, pure=False,
                                               key=f"warm-imports-{uuid.uuid4().hex[:8]}")
                fire_and_forget(self.warm)
        except BaseException as exc:  # noqa: BLE001 - raised again by take()
            self.error = exc

    def take(self, workers: int) -> tuple[LocalCluster, Client]:
        """Wait for the start, grow to ``workers`` workers with
        :func:`default_worker_resources`; the cluster and its client."""
        self._thread.join()
        if self.error is not None:
            raise self.error
        assert self.cluster is not None and self.client is not None
        with self._spawning():
            add_workers(self.cluster, default_worker_resources(workers)[1:])
        self.taken, self.warm = True, None  # fire-and-forget: it finishes on its own
        return self.cluster, self.client

    def _spawning(self) -> Any:
        """Dask starts the worker processes with :attr:`method` (its default without one)."""
        if self.method is None:
            return contextlib.nullcontext()
        return dask.config.set({"distributed.worker.multiprocessing-method": self.method})

    def close(self) -> None:
        """Stop the cluster unless :meth:`take` handed it out."""
        self._thread.join()
        if self.taken:
            return
        if self.client is not None:
            if self.warm is not None:  # let it finish: a cancelled task logs a warning
                wait([self.warm], timeout=30)
            self.client.close()
        if self.cluster is not None:
            self.cluster.close()


def warm_imports() -> None:
    """Import what daskrl's tasks use (run on a new worker before its first task)."""
    import gymnasium  # noqa: F401
    import torch  # noqa: F401

    from daskrl.algos import actor_critic  # noqa: F401
    from daskrl.core import roles  # noqa: F401
    from daskrl.distributions import base  # noqa: F401


def default_worker_resources(workers: int) -> list[dict[str, float]]:
    """``CPU=1`` per worker; the first worker also advertises the GPUs torch can see.

    Examples
    --------
    >>> default_worker_resources(2)[1]
    {'CPU': 1}
    """
    if workers < 1:
        raise ValueError(f"--workers must be >= 1, got {workers}")
    gpus = _visible_gpus()
    out: list[dict[str, float]] = [{"CPU": 1} for _ in range(workers)]
    if gpus:
        out[0]["GPU"] = gpus
    return out


def _visible_gpus() -> int:
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) == "":
        return 0
    if not any(Path(p).exists() for p in ("/dev/nvidia0", "/dev/kfd", "/dev/dxg")):
        return 0  # no GPU device node: no need to import torch to know
    try:
        import torch

        return torch.cuda.device_count()
    except Exception:  # noqa: BLE001 - no torch / broken driver: no GPU
        return 0


def tls_security(ca_file: str, cert: str, key: str | None = None) -> Security:
    """Client credentials for a scheduler that requires TLS (``tls://`` addresses).

    Examples
    --------
    >>> tls_security("ca.pem", "client.pem", "client.key")  # doctest: +SKIP
    """
    for label, path in (("--tls-ca-file", ca_file), ("--tls-cert", cert), ("--tls-key", key)):
        if path is not None and not os.path.isfile(path):
            raise ValueError(f"{label} {path!r}: no such file")
    return Security(tls_ca_file=ca_file, tls_client_cert=cert, tls_client_key=key,
                    require_encryption=True)


def connect(address: str, timeout: float = 10.0, security: Security | None = None,
            workers_within: float = 10.0) -> Client:
    """A client of the scheduler at ``address``; raises ``ConnectionError`` naming it.

    A scheduler with no worker yet (a cluster still starting) is given ``workers_within``
    seconds for its first one to register; the placement then refuses in one line if none
    did.
    """
    if address.startswith("tls://") and security is None:
        raise ConnectionError(f"the scheduler at {address!r} requires TLS: pass --tls with "
                              "--tls-ca-file, --tls-cert and --tls-key")
    try:
        client = Client(address, timeout=timeout, security=security)
    except (OSError, TimeoutError) as exc:
        raise ConnectionError(
            f"cannot reach the Dask scheduler at {address!r} within {timeout:g}s ({exc}); "
            "start one with `dask scheduler`, or drop --scheduler to use the embedded cluster"
        ) from None
    register(client)
    if not scheduler_workers(client):
        with contextlib.suppress(TimeoutError):
            client.wait_for_workers(1, timeout=workers_within)
    return client


def worker_id(name: Any, address: str) -> str:
    """How daskrl names a worker: its Dask name when that is a string, else its address.

    Dask resolves a name in a task's ``workers=`` restriction, or in ``scatter``, only as
    the very object the worker registered: a ``LocalCluster`` names its workers ``0, 1, ...``,
    and ``"0"`` would be taken for a host name (a task restricted to it never runs, a
    scatter to it fails). String names, which ``dask worker --name`` and batch jobs give,
    survive a restart; addresses are what every worker has (``dask worker --nworkers N``
    without ``--name`` names them so).

    Examples
    --------
    >>> worker_id("w0", "tcp://127.0.0.1:40001"), worker_id(0, "tcp://127.0.0.1:40002")
    ('w0', 'tcp://127.0.0.1:40002')
    """
    return name if isinstance(name, str) else address


def worker_resources(client: Client) -> dict[str, dict[str, float]]:
    """Worker (:func:`worker_id`) -> advertised resources, as the scheduler sees them now."""
    return {worker_id(w["name"], addr): dict(w.get("resources") or {})
            for addr, w in scheduler_workers(client).items()}


def worker_processes(client: Client) -> dict[str, str]:
    """Worker (:func:`worker_id`) -> the process it runs in, ``"host:pid"``.

    Thread workers (``LocalCluster(processes=False)``) share their client's process, and
    ``dask worker --nworkers N`` starts N processes: what memory a worker can use is its
    process's. A worker that does not answer (it is leaving) is its own process.
    """
    info = scheduler_workers(client)
    pids = client.run(os.getpid, on_error="ignore")
    return {worker_id(w["name"], addr): f"{w.get('host')}:{pids.get(addr, addr)}"
            for addr, w in info.items()}
