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
import os
import signal
import sys
import threading
import time
import types
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from daskrl.config_flags import check_flags, flags_of, graph_help, parse_config
from daskrl.core.resources import parse_role_resources
from daskrl.core.script import UserError, load_graph

GRAPH_COMMANDS = ("train", "graph")
"""The commands that take a graph script, and with it the flags of its ``Config``."""


class _Parser(argparse.ArgumentParser):
    """argparse whose errors are one :class:`UserError` line (argparse prints usage too)."""

    def error(self, message: str) -> NoReturn:
        raise UserError(f"{message} (see `{self.prog} --help`)")


# --------------------------------------------------------------------------- run flags


def _parser(graph_flags_help: str | None = None
            ) -> tuple[argparse.ArgumentParser, dict[str, list[str]]]:
    """The run flags' parser, and each graph command's run flags (a graph's Config adds its
    own, parsed by :func:`parse_config`; ``graph_flags_help`` ends their ``--help``)."""
    from daskrl.cluster.jobqueue_spec import add_jobqueue_flags
    from daskrl.distributions import DISTRIBUTIONS

    epilog = (graph_flags_help if graph_flags_help else
              "graph settings: `daskrl train GRAPH --help` lists the flags of GRAPH's Config")
    names = ", ".join(sorted(DISTRIBUTIONS))
    subparser = {"allow_abbrev": False, "formatter_class": argparse.RawDescriptionHelpFormatter}
    parser = _Parser(prog="daskrl", allow_abbrev=False,
                     description="Reinforcement learning as resource-annotated Dask graphs.")
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser("train", help="train a graph script on a Dask cluster",
                           description="Train GRAPH (e.g. graphs/ppo.py) on a Dask cluster; "
                                       "GRAPH may stand anywhere on the line.",
                           epilog=epilog, **subparser)
    flags: dict[str, list[str]] = {"train": [], "graph": []}

    def add(parser: Any, command: str, *names: str, **kwargs: Any) -> None:
        flags[command] += parser.add_argument(*names, **kwargs).option_strings

    add(train, "train", "graph", help="graph script, e.g. graphs/ppo.py")
    add(train, "train", "--distribution", default=None,
        help="placement policy NAME[:KEY=VALUE,...], e.g. data-parallel:allreduce=torch "
             f"(default: the graph's own, actors-learner for most); names: {names}")
    add(train, "train", "--steps", type=int, default=500_000, help="env steps to train for")
    add(train, "train", "--seed", type=int, default=1, help="run seed")
    add(train, "train", "--workers", type=int, default=None,
        help="worker processes of the embedded cluster (default: as many as the "
             "distribution wants for the graph, at most one per CPU core)")
    add(train, "train", "--scheduler", default=None,
        help="address of an existing Dask scheduler, or 'sync' to run every task in this "
             "process (default: an embedded cluster)")
    add(train, "train", "--tls", action="store_true",
        help="encrypt comms: temporary credentials for the embedded cluster, or "
             "--tls-ca-file/--tls-cert/--tls-key for --scheduler tls://...")
    add(train, "train", "--tls-ca-file", default=None, help="CA certificate (PEM)")
    add(train, "train", "--tls-cert", default=None, help="client certificate (PEM)")
    add(train, "train", "--tls-key", default=None, help="client private key (PEM)")
    add(train, "train", "--resources", action="append", default=[],
        metavar="ROLE=KEY:N[,KEY:N]",
        help="override a role's resources, e.g. learner=GPU:1 (repeatable)")
    add(train, "train", "--out", type=Path, default=None,
        help="output folder (default: runs/<graph>-<time>)")
    add(train, "train", "--resume", action="store_true",
        help="continue from --out's checkpoint")
    add(train, "train", "--report", type=Path, default=None, metavar="FILE.html",
        help="save Dask's performance report of the run (task stream, worker profiles, "
             "bandwidth)")
    add(train, "train", "--checkpoint-every", type=int, default=10,
        help="iterations per checkpoint (written at the end of the task that reaches the "
             "count, when short iterations share tasks)")
    add(train, "train", "--no-eval", dest="eval", action="store_false",
        help="skip the final deterministic evaluation")
    add(train, "train", "--no-progress", dest="progress", action="store_false",
        help="no progress bar")
    add(train, "train", "--deterministic", action="store_true",
        help="bit-identical runs for a --seed whatever the workers (no fusion, one torch "
             "thread per task, actor state in checkpoints); not async")
    add(train, "train", "--env-retries", type=int, default=2,
        help="times a rollout whose env raised is retried on rebuilt envs")
    flags["train"] += [s for a in add_jobqueue_flags(train) for s in a.option_strings]
    graph = sub.add_parser("graph", help="draw one iteration's task graph (.svg/.png/.pdf)",
                           description="Draw one iteration of GRAPH under a distribution: "
                                       "tasks labelled by role, coloured by resource.",
                           epilog=epilog.replace("daskrl train", "daskrl graph"), **subparser)
    add(graph, "graph", "graph", help="graph script, e.g. graphs/ppo.py")
    add(graph, "graph", "--distribution", default=None,
        help="placement policy NAME[:KEY=VALUE,...], e.g. data-parallel:allreduce=torch; "
             f"names: {names}")
    add(graph, "graph", "--out", type=Path, required=True,
        help="picture file: .svg, .png or .pdf")
    plot = sub.add_parser("plot", help="learning-curve PNGs of a run folder",
                          description="Write returns.png, speed.png and losses.png for a run.",
                          allow_abbrev=False)
    plot.add_argument("run_dir", type=Path, help="the --out folder of a training run")
    plot.add_argument("--out", type=Path, default=None, help="where to write (default: run_dir)")
    prof = sub.add_parser("profile", help="where an iteration's time goes, and the bottleneck",
                          description="Break a run's iteration time into env stepping, "
                                      "inference, learning and scheduler/transfer/idle.",
                          allow_abbrev=False)
    prof.add_argument("run_dir", type=Path, help="the --out folder of a training run")
    rep = sub.add_parser("replay", help="re-run a failed task in this process",
                         description="Run the fragment call saved in OUT/failures/<task>.pkl "
                                     "again in this process (breakpoint() works), after "
                                     "printing its original traceback. The file holds pickled "
                                     "code: replay only files from runs you trust.",
                         allow_abbrev=False)
    rep.add_argument("file", type=Path, help="a file from a run's failures/ folder")
    rep.add_argument("--pdb", action="store_true", help="open pdb where the replay raises")
    return parser, flags


def _graph_index(argv: Sequence[str]) -> int | None:
    """Where the graph script stands in a ``train``/``graph`` command line: the first word
    after the command that is not a flag and names a ``.py`` file."""
    if not argv or argv[0] not in GRAPH_COMMANDS:
        return None
    return next((i for i, word in enumerate(argv) if i > 0 and not word.startswith("-")
                 and word.endswith(".py")), None)


def _graph_path(argv: Sequence[str]) -> str | None:
    """The graph script of a ``train``/``graph`` command line, wherever it stands.

    Examples
    --------
    >>> _graph_path(["train", "--steps", "1000", "graphs/ppo.py", "--num-envs", "4"])
    'graphs/ppo.py'
    >>> _graph_path(["plot", "runs/x"]) is None
    True
    """
    index = _graph_index(argv)
    return None if index is None else argv[index]


def parse_command_line(argv: Sequence[str]
                       ) -> tuple[argparse.Namespace, types.ModuleType | None, Any]:
    """``(args, graph module, graph config)`` of a ``daskrl`` command line.

    Run flags are argparse's; the words it does not know are the graph's ``Config`` flags
    (:func:`parse_config`). Module and config are None for commands without a graph.

    Raises
    ------
    UserError
        One line naming the bad flag or value.

    Examples
    --------
    >>> args, module, config = parse_command_line(
    ...     ["train", "--steps", "1000", "graphs/ppo.py", "--num-envs", "4", "--no-anneal-lr"])
    >>> args.steps, args.graph, config.num_envs, config.anneal_lr
    (1000, 'graphs/ppo.py', 4, False)
    """
    from daskrl.cluster.forkserver import imports_without_gc

    argv = list(argv)
    index = _graph_index(argv)
    if index is None:
        args, extras = _parser()[0].parse_known_args(argv)
        if args.command not in GRAPH_COMMANDS:
            if extras:
                raise UserError(f"unrecognized arguments: {' '.join(extras)} "
                                f"(see `daskrl {args.command} --help`)")
            return args, None, None
        index = argv.index(args.graph)  # not a .py name: load_graph says what is wrong
    command, path = argv[0], argv[index]
    with imports_without_gc():  # torch and the graph: the start-up's bulk
        module = load_graph(path)
    prog = f"daskrl {command} {path}"
    words = [*argv[1:index], *argv[index + 1:]]
    wants_help = any(w in ("-h", "--help") for w in words)
    parser, run_flags = _parser(
        f"graph settings ({path}'s Config):\n{graph_help(module.Config, prog)}"
        if wants_help else None)
    args, rest = parser.parse_known_args([command, path, *words])
    try:
        clash = sorted(flags_of(module.Config) & set(run_flags[command]))
    except NameError as exc:
        raise UserError(f"{path}: a Config field's type cannot be resolved ({exc})") from None
    if clash:
        raise UserError(f"{path}: Config fields give the run flag(s) {', '.join(clash)} of "
                        f"`daskrl {command}`: rename those fields")
    check_flags(rest, module.Config, run_flags[command], prog)
    return args, module, parse_config(module.Config, rest, prog)


def _early_cluster(argv: Sequence[str]) -> Any:
    """Start the embedded cluster now when ``argv`` is a ``train`` that will use one, so its
    worker starts while this process imports torch and the graph; else ``None``."""
    path = _graph_path(argv)
    if path is None or argv[0] != "train" or not Path(path).is_file():
        return None
    flags = {a.split("=", 1)[0] for a in argv if a.startswith("-")}
    if flags & {"-h", "--help", "--scheduler", "--cluster", "--cluster-config"}:
        return None
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
    :func:`parse_command_line`); ``early``: a :class:`~daskrl.cluster.local.ClusterStart` begun by
    :func:`main` for the embedded cluster."""
    from distributed import Client

    from daskrl.cluster.jobqueue import describe, start_pools
    from daskrl.cluster.local import connect, default_worker_resources, local_cluster
    from daskrl.core.failures import FragmentError
    from daskrl.distributions import get_distribution
    from daskrl.runtime.backend import DaskBackend, SyncBackend
    from daskrl.runtime.driver import RunSettings, check_distribution, check_settings, train

    try:
        overrides = parse_role_resources(args.resources)
        if args.workers is not None and args.workers < 1:
            raise ValueError(f"--workers must be >= 1, got {args.workers}")
        algo = module.build(config).with_resources(overrides)
        distribution = get_distribution(args.distribution or algo.distribution)
        check_distribution(distribution, algo, deterministic=args.deterministic)
        wanted = distribution.workers_wanted(algo)
        workers = args.workers or max(1, min(os.cpu_count() or 1, wanted))
        batch = _batch_spec(args)
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


def _terminate(signum: int, frame: Any) -> None:
    """SIGTERM (``kill``, ``timeout``, a batch system) stops a run the way Ctrl-C does."""
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``daskrl`` console script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _terminate)  # like Ctrl-C: checkpoint, cancel jobs
    from daskrl.cluster.forkserver import imports_without_gc

    with imports_without_gc():  # torch, Dask and the graph: the start-up's bulk
        early = _early_cluster(argv)
    try:
        args, module, config = parse_command_line(argv)
        if args.command == "train":
            return cmd_train(args, module, config, early)
        if args.command == "graph":
            return cmd_graph(args, module, config)
        if args.command == "profile":
            from daskrl.observe.profile import report

            try:
                print(report(args.run_dir))
            except (FileNotFoundError, ValueError) as exc:
                raise UserError(str(exc)) from None
        if args.command == "replay":
            from daskrl.core.failures import load_failure, replay

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
            from daskrl.observe.plot import plot_run

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
