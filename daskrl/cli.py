"""``daskrl`` command line: train a graph script, render its task graph.

Run flags (``--distribution``, ``--steps``, ...) are argparse's; a graph script's ``Config``
dataclass becomes the remaining flags through :func:`tyro.cli`, so every type a field may hold
(bool as ``--x/--no-x``, tuples, lists, ``Literal``, ``Optional``) is a flag, with the field's
docstring (or :func:`daskrl.setting` text) as its help. The graph script may stand anywhere on
the line; flags are never abbreviated; bad input ends with one ``daskrl: error:`` line on
stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import os
import signal
import sys
import threading
import time
import types
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from daskrl.cluster.forkserver import WORKER_NUMERICS, imports_without_gc
from daskrl.core.resources import parse_role_resources
from daskrl.core.script import MissingExtra, UserError, build_algorithm
from daskrl.run_flags import graph_path, parse_command_line
from daskrl.run_reports import REPORTS


def _early_cluster(argv: Sequence[str]) -> Any:
    """Start the embedded cluster now when ``argv`` is a ``train`` that will use one, so its
    worker starts while this process imports torch and the graph; else ``None``."""
    path = graph_path(argv)
    if path is None or argv[0] != "train" or not Path(path).is_file():
        return None
    flags = {a.split("=", 1)[0] for a in argv if a.startswith("-")}
    if flags & {"-h", "--help", "--scheduler", "--cluster", "--cluster-config"}:
        return None
    outs = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--out"]
    outs += [a.split("=", 1)[1] for a in argv if a.startswith("--out=")]
    if any(p.exists() and not p.is_dir() for o in outs for p in (Path(o), *Path(o).parents)):
        return None  # refused in one line before any cluster (check_settings)
    from daskrl.cluster.forkserver import worker_forkserver

    worker_forkserver()  # first: it imports what workers need while this process goes on
    from daskrl.cluster.local import ClusterStart

    return ClusterStart(security=True if "--tls" in flags else None)


# --------------------------------------------------------------------------- commands


def _security(args: argparse.Namespace) -> Any:
    if not args.tls:
        return None
    from daskrl.cluster.local import tls_security

    if not (args.tls_ca_file and args.tls_cert):
        raise UserError("--tls with --scheduler needs --tls-ca-file and --tls-cert "
                        "(and --tls-key unless the cert file holds the key)")
    try:
        return tls_security(args.tls_ca_file, args.tls_cert, args.tls_key)
    except ValueError as exc:
        raise UserError(str(exc)) from None


def _batch_spec(args: argparse.Namespace) -> Any:
    """The ``--cluster`` job settings of ``args``; None without ``--cluster``."""
    from daskrl.cluster.jobqueue_spec import cluster_spec

    return cluster_spec(args.cluster, args.cluster_config, queue=args.queue,
                        walltime=args.walltime, cores=args.cores, memory=args.memory,
                        gpus_per_job=args.gpus_per_job, cpu_jobs=args.cpu_jobs,
                        gpu_jobs=args.gpu_jobs, job_extra=args.job_extra)


def cmd_train(args: argparse.Namespace, module: types.ModuleType, config: Any,
              early: Any = None) -> int:
    """Run ``daskrl train``: ``module``'s graph built from ``config`` (its flags, parsed by
    :func:`~daskrl.run_flags.parse_command_line`); ``early``: a
    :class:`~daskrl.cluster.local.ClusterStart` begun by :func:`main` for the embedded cluster."""
    from distributed import Client

    from daskrl.cluster.jobqueue import describe, start_pools
    from daskrl.cluster.local import (
        close_cluster,
        connect,
        default_worker_resources,
        local_cluster,
        scale_like,
    )
    from daskrl.core.failures import FragmentError, RunStopped
    from daskrl.distributions import auto_redecides, get_distribution, is_auto
    from daskrl.observe.board_feed import page_line
    from daskrl.runtime.auto import refuse_deterministic, resolve, sizing
    from daskrl.runtime.dask_backend import DaskBackend
    from daskrl.runtime.driver import (
        RunSettings,
        check_distribution,
        check_settings,
        finished_iterations,
        train,
    )
    from daskrl.runtime.sync_backend import SyncBackend

    try:
        overrides = parse_role_resources(args.resources)
        if args.workers is not None and args.workers < 1:
            raise ValueError(f"--workers must be >= 1, got {args.workers}")
        algo = build_algorithm(module, config, args.graph).with_resources(overrides)
        auto = is_auto(args.distribution)
        if auto:  # probed on the cluster once it runs; sized for the largest candidate
            redecide = auto_redecides(args.distribution)
            refuse_deterministic(args.deterministic)
            distribution = sizing(algo)
        else:
            distribution = get_distribution(args.distribution or algo.distribution)
            check_distribution(distribution, algo, deterministic=args.deterministic)
        wanted = distribution.workers_wanted(algo)
        workers = args.workers or max(1, min(os.cpu_count() or 1, wanted))
        batch = _batch_spec(args)
        elastic = None
        if args.adapt is not None:
            elastic = _elastic(args, wanted)
            workers = elastic.minimum
            if batch is not None:
                batch = dataclasses.replace(batch, cpu_jobs=elastic.minimum)
        if not args.scheduler and batch is None and not auto:  # the workers are known
            from daskrl.core.placement import plan_placement

            spec = {f"w{i}": r for i, r in enumerate(default_worker_resources(workers))}
            distribution.check_capacity(plan_placement(distribution.fragments(algo), spec),
                                        spec, algo)
        if batch is not None and (args.scheduler or args.tls):
            raise ValueError("--cluster starts its own scheduler: drop --scheduler/--tls")
    except (ValueError, TypeError) as exc:
        raise UserError(str(exc)) from None
    out = args.out or Path("runs") / f"{Path(args.graph).stem}-{time.strftime('%Y%m%d-%H%M%S')}"
    settings = RunSettings(out=out, steps=args.steps, seed=args.seed, resume=args.resume,
                           checkpoint_every=args.checkpoint_every, eval=args.eval,
                           progress=args.progress, deterministic=args.deterministic,
                           env_retries=args.env_retries, eval_every=args.eval_every,
                           task_timeout=args.task_timeout, max_recoveries=args.max_recoveries,
                           max_restarts=args.max_restarts, replan_timeout=args.replan_timeout,
                           meta={"graph": args.graph, "graph_file": str(Path(args.graph).resolve()),
                                 "config": dataclasses.asdict(config)})
    try:
        check_settings(settings)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    if args.track == "mlflow" and importlib.util.find_spec("mlflow") is None:
        raise UserError("--track mlflow needs MLflow: pip install 'daskrl[mlflow]'")
    if args.report is not None and args.scheduler == "sync":
        raise UserError(f"--report {args.report}: Dask's performance report records a "
                        "distributed scheduler's task stream, and --scheduler sync runs without "
                        "one; drop --report, or leave out --scheduler sync")
    if settings.resume:
        done = finished_iterations(out)
        total = max(1, -(-settings.steps // algo.steps_per_iteration))
        if done >= total:
            print(f"daskrl: {out} is already complete: {done} iterations done, --steps "
                  f"{settings.steps} asks for {total}; pass a larger --steps to train further",
                  file=sys.stderr)
            return 0
    if args.max_restarts and (args.scheduler or batch is not None):
        raise UserError("--max-restarts starts the embedded cluster again: not with "
                        "--scheduler or --cluster (restart those yourself, then --resume)")
    cluster = client = None
    try:
        if args.scheduler == "sync":
            backend: Any = SyncBackend()
            print("scheduler: synchronous, in this process (breakpoint() works in fragments)",
                  file=sys.stderr)
        else:
            if args.scheduler:
                client = connect(args.scheduler, security=_security(args))
            elif batch is not None:
                try:
                    cluster, client = start_pools(batch, algo, distribution, out / "jobs")
                except (ValueError, RuntimeError, TimeoutError) as exc:
                    raise UserError(str(exc)) from None
                print(f"{describe(cluster.spec)}; jobs {cluster.job_ids()}", file=sys.stderr)
            else:
                if early is not None:
                    cluster, client = early.take(workers)
                else:
                    cluster = local_cluster(default_worker_resources(workers), security=args.tls)
                    client = Client(cluster)
            backend = DaskBackend(client, scheduler=cluster.scheduler if cluster else None)
            print(f"scheduler: {client.scheduler.address}\ndashboard: {client.dashboard_link}",
                  file=sys.stderr)
            print(page_line(client.dashboard_link), file=sys.stderr)
        try:
            if auto:
                distribution, settings = resolve(backend, algo, settings,
                                                 redecide=redecide)
            if elastic is not None and cluster is not None:
                from daskrl.cluster.elastic import adapt

                if batch is None:
                    scale_like(cluster, default_worker_resources(1)[0])
                adapt(cluster, elastic)
                settings = dataclasses.replace(settings, observers=(elastic.observe,))
            if args.report is not None and client is not None:
                from distributed import performance_report

                with performance_report(filename=str(args.report)):
                    summary = train(backend, algo, distribution, settings)
                print(f"wrote {args.report}", file=sys.stderr)
            elif settings.max_restarts and cluster is not None and batch is None:
                from daskrl.runtime.restart import train_with_restarts

                def restart() -> Any:
                    """Close the lost embedded cluster; a new one's backend."""
                    nonlocal cluster, client
                    client.close()
                    close_cluster(cluster)
                    cluster = local_cluster(default_worker_resources(workers),
                                            security=args.tls)
                    client = Client(cluster)
                    print(f"scheduler: {client.scheduler.address}", file=sys.stderr)
                    return DaskBackend(client, scheduler=cluster.scheduler)

                summary = train_with_restarts(backend, restart, algo, distribution, settings)
            else:
                summary = train(backend, algo, distribution, settings)
        except (ValueError, FloatingPointError, FragmentError, RunStopped) as exc:
            raise UserError(str(exc)) from None
    except ConnectionError as exc:
        raise UserError(str(exc)) from None
    finally:
        if client is not None:
            client.close()
        if cluster is not None:
            close_cluster(cluster)  # without waiting 30 s for a scheduler that is gone
    if elastic is not None:  # the cluster's sizes, beside the run's own figures
        from daskrl.observe.metrics import write_summary

        summary["adapt"] = elastic.record()
        write_summary(out / "summary.json", summary)
        print(f"--adapt: {len(elastic.changes)} change(s), {summary['adapt']['worker_s']:.1f} "
              "worker-seconds", file=sys.stderr)
    keys = ("env_steps", "wall_s", "env_steps_per_s", "eval_return_mean")
    print(" ".join(f"{k}={summary[k]:.6g}" for k in keys if k in summary))
    print(f"wrote {out}/metrics.csv, {out}/summary.json, {out}/checkpoints/")
    if args.track == "mlflow":
        from daskrl.trained.track import log_run_mlflow

        print(f"mlflow run {log_run_mlflow(out)} (experiment daskrl)")
    return 0


def _elastic(args: argparse.Namespace, usable: int) -> Any:
    """``--adapt``'s policy, or a one-line refusal where it cannot apply."""
    from daskrl.cluster.elastic import plan

    elastic = plan(args.adapt, usable, args.deterministic)
    if args.scheduler:
        raise ValueError("--adapt sizes the embedded cluster or a --cluster pool: with "
                         "--scheduler, scale your own cluster (its cluster.adapt())")
    if args.max_restarts:
        raise ValueError("--adapt with --max-restarts: a restarted cluster would not adapt; "
                         "drop one of them")
    return elastic


def _default(f: dataclasses.Field) -> Any:
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


def cmd_graph(args: argparse.Namespace, module: types.ModuleType, config: Any) -> int:
    """Run ``daskrl graph``: ``config``'s fields that differ from their defaults are applied."""
    from daskrl.observe.render import render_iteration

    overrides = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)
                 if f.init and getattr(config, f.name) != _default(f)}
    try:
        path = render_iteration(args.graph, args.distribution, args.out, overrides)
    except (ValueError, TypeError, RuntimeError) as exc:
        raise UserError(str(exc)) from None
    print(f"wrote {path}")
    return 0


def grid_values(module: types.ModuleType, words: Sequence[str], prog: str,
                flag: str = "--grid") -> dict[str, list[Any]]:
    """``--grid KEY=V1,V2`` (or ``flag``) words as typed values, each read as its ``Config``
    flag would be."""
    from daskrl.config_flags import parse_config

    fields = {f.name: f for f in dataclasses.fields(module.Config) if f.init}
    grid: dict[str, list[Any]] = {}
    for word in words:
        key, sep, values = word.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not values:
            raise UserError(f"{flag} {word}: expected KEY=V1,V2,... (a Config field and its "
                            "values)")
        if key not in fields:
            raise UserError(f"{flag} {word}: {prog}'s Config has no field {key!r}; it has "
                            f"{sorted(fields)}")
        option = "--" + key.replace("_", "-")
        typed = []
        for value in values.split(","):
            if isinstance(_default(fields[key]), bool):
                if value.lower() not in ("true", "false"):
                    raise UserError(f"{flag} {word}: {value!r} is not true or false")
                typed.append(value.lower() == "true")
                continue
            config = parse_config(module.Config, [option, *value.split()], prog)
            typed.append(getattr(config, key))
        grid[key] = typed
    return grid


def cmd_sweep(args: argparse.Namespace, module: types.ModuleType, config: Any) -> int:
    """Run ``daskrl sweep``: trials of ``module``'s graph on one cluster, then the report."""
    from daskrl.cluster.local import connect
    from daskrl.sweeps.report import table
    from daskrl.sweeps.sweep import sweep

    prog = f"daskrl sweep {args.graph}"
    grid = grid_values(module, args.grid, prog)
    shared = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)
              if f.init and getattr(config, f.name) != _default(f)}
    starts = grid_values(module, args.start, prog, "--start")
    width = max((len(v) for v in starts.values()), default=0)
    start = [{k: v[i % len(v)] for k, v in starts.items()} for i in range(width)]
    clash = sorted(set(shared) & set(grid))
    if clash:
        raise UserError(f"{clash} set both as a flag and by --grid: keep one")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = args.out or Path("runs") / f"sweep-{Path(args.graph).stem}-{stamp}"
    try:
        parse_role_resources(args.resources)  # one line naming a bad word
        resources = dict(word.split("=", 1) for word in args.resources)
        batch = _batch_spec(args)
        if batch is not None and args.scheduler:
            raise ValueError("--cluster starts its own scheduler: drop --scheduler")
        from daskrl.sweeps.report import bootstrap_reps

        bootstrap_reps()  # a bad $DASKRL_BOOTSTRAP_REPS before any batch job is submitted
    except (ValueError, TypeError) as exc:
        raise UserError(str(exc)) from None
    cluster = client = None
    try:
        if args.scheduler:
            client = connect(args.scheduler)
        elif batch is not None:
            from daskrl.cluster.jobqueue import describe, start_pools

            try:
                cluster, client = start_pools(batch, log_directory=out / "jobs")
            except (ValueError, RuntimeError, TimeoutError) as exc:
                raise UserError(str(exc)) from None
            print(f"{describe(cluster.spec)}; jobs {cluster.job_ids()}", file=sys.stderr)
        result = sweep(args.graph, out=out, seeds=args.seeds, seed=args.seed, grid=grid,
                       search=args.search, trials=args.trials, space=args.space,
                       sampler=args.sampler, pruner=args.pruner, pbt=args.pbt,
                       population=args.population, interval=args.interval,
                       quantile=args.quantile, start=start, concurrency=args.concurrency,
                       client=client,
                       workers=args.workers, steps=args.steps, resume=args.resume,
                       progress=args.progress, distribution=args.distribution,
                       eval_every=args.eval_every, checkpoint_every=args.checkpoint_every,
                       deterministic=args.deterministic, resources=resources, **shared)
    except ValueError as exc:
        raise UserError(str(exc).replace("resume=True", "--resume").replace(
            "another out", "another --out")) from None
    except ConnectionError as exc:
        raise UserError(str(exc)) from None
    except KeyboardInterrupt:
        print(f"daskrl: sweep interrupted; finished trials are kept, the others were "
              f"checkpointed: `daskrl sweep {args.graph} ... --out {out} --resume` goes on",
              file=sys.stderr)
        raise SystemExit(130) from None
    finally:
        if client is not None:
            client.close()
        if cluster is not None:
            cluster.close()
    print(table(result.report))
    print(f"wrote {out}/report.md, {out}/report.json, {out}/curves.png, {out}/sweep.json")
    return 0


def _terminate(signum: int, frame: Any) -> None:
    """SIGTERM (``kill``, ``timeout``, a batch system) stops a run the way Ctrl-C does."""
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``daskrl`` console script."""
    if argv is None:  # this process is the command's own: MKL's kernels by CPU, not alignment
        for key, value in WORKER_NUMERICS.items():  # read at MKL's first call, not at import
            os.environ.setdefault(key, value)
    argv = list(sys.argv[1:] if argv is None else argv)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _terminate)  # like Ctrl-C: checkpoint, cancel jobs

    with imports_without_gc():  # torch, Dask and the graph: the start-up's bulk
        early = _early_cluster(argv)
    try:
        args, module, config = parse_command_line(argv)
        if args.command == "train":
            return cmd_train(args, module, config, early)
        if args.command == "graph":
            return cmd_graph(args, module, config)
        if args.command == "sweep":
            return cmd_sweep(args, module, config)
        if args.command in REPORTS:
            return REPORTS[args.command](args)
    except (UserError, MissingExtra) as exc:
        print(f"daskrl: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("daskrl: interrupted; the last finished iteration is checkpointed", file=sys.stderr)
        return 130
    finally:
        if early is not None:
            early.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
