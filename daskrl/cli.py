"""``daskrl`` command line: train a graph script, render its task graph."""

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

from .resources import parse_role_resources


class UserError(Exception):
    """Bad input: reported as one line on stderr with a non-zero exit."""


def load_graph(path: str) -> types.ModuleType:
    """Import a graph script by path; it must define ``Config`` and ``build(config)``.

    The module is pickled by value, so workers need not have the script on their path.
    """
    file = Path(path)
    if not file.is_file():
        raise UserError(f"graph script {path!r} not found: pass a path like graphs/ppo.py")
    name = f"daskrl_graph_{file.stem}"
    spec = importlib.util.spec_from_file_location(name, file)
    if spec is None or spec.loader is None:
        raise UserError(f"cannot import graph script {path!r}: is it a .py file?")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    missing = [n for n in ("Config", "build") if not hasattr(module, n)]
    if missing or not dataclasses.is_dataclass(module.Config):
        raise UserError(
            f"graph script {path!r} must define a dataclass `Config` and `build(config)` "
            f"returning a daskrl.Algorithm (missing: {', '.join(missing) or 'dataclass Config'})"
        )
    import cloudpickle

    cloudpickle.register_pickle_by_value(module)
    return module


def _flag_type(tp: Any) -> Any:
    tp = {"int": int, "float": float, "str": str, "bool": bool}.get(tp, tp) if isinstance(
        tp, str) else tp
    return tp


def add_config_flags(parser: argparse.ArgumentParser, config_cls: type) -> None:
    """One ``--flag`` per field of the graph's ``Config`` dataclass."""
    group = parser.add_argument_group(f"{config_cls.__module__.removeprefix('daskrl_graph_')} "
                                      "settings")
    for f in dataclasses.fields(config_cls):
        flag = "--" + f.name.replace("_", "-")
        tp = _flag_type(f.type)
        text = f.metadata.get("help", "")
        if tp is bool:
            group.add_argument(flag, dest=f.name, default=f.default,
                               action=argparse.BooleanOptionalAction, help=text)
        else:
            group.add_argument(flag, dest=f.name, type=tp, default=f.default,
                               help=f"{text} (default: {f.default})")


def _parser(graph_module: types.ModuleType | None) -> argparse.ArgumentParser:
    from .distributions import DISTRIBUTIONS
    from .jobqueue import add_jobqueue_flags

    parser = argparse.ArgumentParser(
        prog="daskrl", description="Reinforcement learning as resource-annotated Dask graphs.")
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser("train", help="train a graph script on a Dask cluster",
                           description="Train GRAPH (e.g. graphs/ppo.py) on a Dask cluster.")
    train.add_argument("graph", help="graph script, e.g. graphs/ppo.py")
    train.add_argument("--distribution", default="actors-learner",
                       help="placement policy NAME[:KEY=VALUE,...], e.g. "
                            "data-parallel:allreduce=torch; "
                            f"names: {', '.join(sorted(DISTRIBUTIONS))}")
    train.add_argument("--steps", type=int, default=500_000, help="env steps to train for")
    train.add_argument("--seed", type=int, default=1, help="run seed")
    train.add_argument("--workers", type=int, default=None,
                       help="worker processes of the embedded cluster (default: one per "
                            "rollout replica, plus one for the learner with "
                            "actors-learner:stale=1, at most one per CPU core)")
    train.add_argument("--scheduler", default=None,
                       help="address of an existing Dask scheduler, or 'sync' to run every "
                            "task in this process (default: an embedded cluster)")
    train.add_argument("--tls", action="store_true",
                       help="encrypt comms: temporary credentials for the embedded cluster, or "
                            "--tls-ca-file/--tls-cert/--tls-key for --scheduler tls://...")
    train.add_argument("--tls-ca-file", default=None, help="CA certificate (PEM)")
    train.add_argument("--tls-cert", default=None, help="client certificate (PEM)")
    train.add_argument("--tls-key", default=None, help="client private key (PEM)")
    train.add_argument("--resources", action="append", default=[], metavar="ROLE=KEY:N[,KEY:N]",
                       help="override a role's resources, e.g. learner=GPU:1 (repeatable)")
    train.add_argument("--out", type=Path, default=None,
                       help="output folder (default: runs/<graph>-<time>)")
    train.add_argument("--resume", action="store_true", help="continue from --out's checkpoint")
    train.add_argument("--report", type=Path, default=None, metavar="FILE.html",
                       help="save Dask's performance report of the run (task stream, "
                            "worker profiles, bandwidth)")
    train.add_argument("--checkpoint-every", type=int, default=10,
                       help="iterations per checkpoint (written at the end of the task that "
                            "reaches the count, when short iterations share tasks)")
    train.add_argument("--no-eval", dest="eval", action="store_false",
                       help="skip the final deterministic evaluation")
    train.add_argument("--no-progress", dest="progress", action="store_false",
                       help="no progress bar")
    train.add_argument("--deterministic", action="store_true",
                       help="bit-identical runs for a --seed whatever the workers (no fusion, "
                            "one torch thread per task, actor state in checkpoints); not async")
    train.add_argument("--env-retries", type=int, default=2,
                       help="times a rollout whose env raised is retried on rebuilt envs")
    add_jobqueue_flags(train)
    if graph_module is not None:
        add_config_flags(train, graph_module.Config)
    graph = sub.add_parser("graph", help="draw one iteration's task graph (.svg/.png/.pdf)",
                           description="Draw one iteration of GRAPH under a distribution: "
                                       "tasks labelled by role, coloured by resource.")
    graph.add_argument("graph", help="graph script, e.g. graphs/ppo.py")
    graph.add_argument("--distribution", default="actors-learner",
                       help="placement policy NAME[:KEY=VALUE,...], e.g. "
                            "data-parallel:allreduce=torch; "
                            f"names: {', '.join(sorted(DISTRIBUTIONS))}")
    graph.add_argument("--out", type=Path, required=True, help="picture file: .svg, .png or .pdf")
    if graph_module is not None:
        add_config_flags(graph, graph_module.Config)
    plot = sub.add_parser("plot", help="learning-curve PNGs of a run folder",
                          description="Write returns.png, speed.png and losses.png for a run.")
    plot.add_argument("run_dir", type=Path, help="the --out folder of a training run")
    plot.add_argument("--out", type=Path, default=None, help="where to write (default: run_dir)")
    prof = sub.add_parser("profile", help="where an iteration's time goes, and the bottleneck",
                          description="Break a run's iteration time into env stepping, "
                                      "inference, learning and scheduler/transfer/idle.")
    prof.add_argument("run_dir", type=Path, help="the --out folder of a training run")
    rep = sub.add_parser("replay", help="re-run a failed task in this process",
                         description="Run the fragment call saved in OUT/failures/<task>.pkl "
                                     "again in this process (breakpoint() works), after "
                                     "printing its original traceback. The file holds pickled "
                                     "code: replay only files from runs you trust.")
    rep.add_argument("file", type=Path, help="a file from a run's failures/ folder")
    rep.add_argument("--pdb", action="store_true", help="open pdb where the replay raises")
    return parser


def _graph_path(argv: Sequence[str]) -> str | None:
    args = list(argv)
    if len(args) >= 2 and args[0] in ("train", "graph") and not args[1].startswith("-"):
        return args[1]
    return None


def _early_cluster(argv: Sequence[str]) -> Any:
    """Start the embedded cluster now when ``argv`` is a ``train`` that will use one, so its
    worker starts while this process imports torch and the graph; else ``None``."""
    path = _graph_path(argv)
    if path is None or argv[0] != "train" or not Path(path).is_file():
        return None
    flags = {a.split("=", 1)[0] for a in argv if a.startswith("-")}
    if flags & {"-h", "--help", "--scheduler", "--cluster", "--cluster-config"}:
        return None
    from .forkserver import worker_forkserver

    worker_forkserver()  # first: it imports what workers need while this process goes on
    from .cluster import ClusterStart

    return ClusterStart(security=True if "--tls" in flags else None)


def _security(args: argparse.Namespace) -> Any:
    if not args.tls:
        return None
    from .cluster import tls_security

    if not (args.tls_ca_file and args.tls_cert):
        raise UserError("--tls with --scheduler needs --tls-ca-file and --tls-cert "
                        "(and --tls-key unless the cert file holds the key)")
    try:
        return tls_security(args.tls_ca_file, args.tls_cert, args.tls_key)
    except ValueError as exc:
        raise UserError(str(exc)) from None


def cmd_train(args: argparse.Namespace, module: types.ModuleType,
              early: Any = None) -> int:
    """Run ``daskrl train`` (``early``: a :class:`~daskrl.cluster.ClusterStart` begun by
    :func:`main` for the embedded cluster)."""
    from distributed import Client

    from .backend import DaskBackend, SyncBackend
    from .cluster import connect, default_worker_resources, local_cluster
    from .distributions import get_distribution
    from .driver import RunSettings, check_settings, train
    from .failures import FragmentError
    from .jobqueue import describe, spec_from_args, start_pools

    fields = {f.name for f in dataclasses.fields(module.Config)}
    try:
        config = module.Config(**{k: v for k, v in vars(args).items() if k in fields})
        distribution = get_distribution(args.distribution)
        if args.deterministic and distribution.name == "async":
            raise ValueError("--deterministic: the async distribution applies gradients in the "
                             "order they arrive; choose a synchronous distribution")
        overrides = parse_role_resources(args.resources)
        if args.workers is not None and args.workers < 1:
            raise ValueError(f"--workers must be >= 1, got {args.workers}")
        algo = module.build(config).with_resources(overrides)
        wanted = getattr(distribution, "workers_wanted", lambda a: a.num_actors)(algo)
        workers = args.workers or max(1, min(os.cpu_count() or 1, wanted))
        batch = spec_from_args(args)
        if batch is not None and (args.scheduler or args.tls):
            raise ValueError("--cluster starts its own scheduler: drop --scheduler/--tls")
    except (ValueError, TypeError) as exc:
        raise UserError(str(exc)) from None
    out = args.out or Path("runs") / f"{Path(args.graph).stem}-{time.strftime('%Y%m%d-%H%M%S')}"
    settings = RunSettings(out=out, steps=args.steps, seed=args.seed, resume=args.resume,
                           checkpoint_every=args.checkpoint_every, eval=args.eval,
                           progress=args.progress, deterministic=args.deterministic,
                           env_retries=args.env_retries,
                           meta={"graph": args.graph, "config": dataclasses.asdict(config)})
    try:
        check_settings(settings)
    except ValueError as exc:
        raise UserError(str(exc)) from None
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
            backend = DaskBackend(client)
            print(f"scheduler: {client.scheduler.address}\ndashboard: {client.dashboard_link}",
                  file=sys.stderr)
        try:
            if args.report is not None and client is not None:
                from distributed import performance_report

                with performance_report(filename=str(args.report)):
                    summary = train(backend, algo, distribution, settings)
                print(f"wrote {args.report}", file=sys.stderr)
            else:
                summary = train(backend, algo, distribution, settings)
        except (ValueError, FloatingPointError, FragmentError) as exc:
            raise UserError(str(exc)) from None
    except ConnectionError as exc:
        raise UserError(str(exc)) from None
    finally:
        if client is not None:
            client.close()
        if cluster is not None:
            cluster.close()
    keys = ("env_steps", "wall_s", "env_steps_per_s", "eval_return_mean")
    print(" ".join(f"{k}={summary[k]:.6g}" for k in keys if k in summary))
    print(f"wrote {out}/metrics.csv, {out}/summary.json, {out}/checkpoints/")
    return 0


def cmd_graph(args: argparse.Namespace, module: types.ModuleType) -> int:
    """Run ``daskrl graph``: config flags that differ from their defaults are applied."""
    from .render import render_iteration

    overrides = {f.name: getattr(args, f.name) for f in dataclasses.fields(module.Config)
                 if getattr(args, f.name) != f.default}
    try:
        path = render_iteration(args.graph, args.distribution, args.out, overrides)
    except (ValueError, TypeError, RuntimeError) as exc:
        raise UserError(str(exc)) from None
    print(f"wrote {path}")
    return 0


def _terminate(signum: int, frame: Any) -> None:
    """SIGTERM (``kill``, ``timeout``, a batch system) stops a run the way Ctrl-C does."""
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``daskrl`` console script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _terminate)  # like Ctrl-C: checkpoint, cancel jobs
    from .forkserver import imports_without_gc

    with imports_without_gc():  # torch, Dask and the graph: the start-up's bulk
        early = _early_cluster(argv)
    try:
        path = _graph_path(argv)
        with imports_without_gc():
            module = load_graph(path) if path else None
        args = _parser(module).parse_args(argv)
        if args.command == "train":
            return cmd_train(args, module, early)
        if args.command == "graph":
            return cmd_graph(args, module)
        if args.command == "profile":
            from .profile import report

            try:
                print(report(args.run_dir))
            except (FileNotFoundError, ValueError) as exc:
                raise UserError(str(exc)) from None
        if args.command == "replay":
            from .failures import load_failure, replay

            try:
                record = load_failure(args.file)
            except (FileNotFoundError, ValueError) as exc:
                raise UserError(str(exc)) from None
            if "unpicklable" in record:
                raise UserError(f"{args.file}: the task's inputs could not be saved "
                                f"({record['unpicklable']}), so it cannot be replayed")
            replay(args.file, post_mortem=args.pdb)
            print(f"{args.file}: the replay finished without an error this time",
                  file=sys.stderr)
        if args.command == "plot":
            from .plot import plot_run

            try:
                for path in plot_run(args.run_dir, args.out):
                    print(f"wrote {path}")
            except (FileNotFoundError, ValueError) as exc:
                raise UserError(str(exc)) from None
    except UserError as exc:
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
