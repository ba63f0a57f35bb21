"""``daskrl``'s command line parsed: run flags through argparse, the graph script found
wherever it stands, and its ``Config`` flags handed to :mod:`daskrl.config_flags`."""

from __future__ import annotations

import argparse
import types
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from daskrl.config_flags import check_flags, flags_of, graph_help, parse_config
from daskrl.core.script import UserError, load_graph
from daskrl.trained.config import config_from_dict, read_yaml

GRAPH_COMMANDS = ("train", "graph", "sweep")
"""The commands that take a graph script, and with it the flags of its ``Config``."""


class _Parser(argparse.ArgumentParser):
    """argparse whose errors are one :class:`UserError` line (argparse prints usage too)."""

    def error(self, message: str) -> NoReturn:
        raise UserError(f"{message} (see `{self.prog} --help`)")


def run_parser(graph_flags_help: str | None = None
            ) -> tuple[argparse.ArgumentParser, dict[str, list[str]]]:
    """The run flags' parser, and each graph command's run flags (a graph's Config adds its
    own, parsed by :func:`parse_config`; ``graph_flags_help`` ends their ``--help``)."""
    from daskrl.cluster.jobqueue_spec import add_jobqueue_flags
    from daskrl.distributions import NAMES

    epilog = (graph_flags_help if graph_flags_help else
              "graph settings: `daskrl train GRAPH --help` lists the flags of GRAPH's Config")
    names = ", ".join(NAMES)
    subparser = {"allow_abbrev": False, "formatter_class": argparse.RawDescriptionHelpFormatter}
    parser = _Parser(prog="daskrl", allow_abbrev=False,
                     description="Reinforcement learning as resource-annotated Dask graphs.")
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser("train", help="train a graph script on a Dask cluster",
                           description="Train GRAPH (e.g. graphs/ppo.py) on a Dask cluster; "
                                       "GRAPH may stand anywhere on the line.",
                           epilog=epilog, **subparser)
    flags: dict[str, list[str]] = {"train": [], "graph": [], "sweep": []}

    def add(parser: Any, command: str, *names: str, **kwargs: Any) -> None:
        flags[command] += parser.add_argument(*names, **kwargs).option_strings

    add(train, "train", "graph", help="graph script, e.g. graphs/ppo.py")
    add(train, "train", "--distribution", default=None,
        help="placement policy NAME[:KEY=VALUE,...], e.g. data-parallel:allreduce=torch "
             f"(default: the graph's own, actors-learner for most); names: {names}; 'auto' "
             "probes each one the graph can use on the cluster for a second, trains under "
             "the fastest and re-decides when workers join or leave or the rate drifts "
             "('auto:once' keeps its first choice)")
    add(train, "train", "--steps", type=int, default=500_000,
        help="env steps to train for, rounded up to whole iterations (default: %(default)s)")
    add(train, "train", "--seed", type=int, default=1,
        help="seeds the learner, every replica's envs and the evaluation (default: %(default)s)")
    add(train, "train", "--workers", type=int, default=None,
        help="worker processes of the embedded cluster (default: as many as the "
             "distribution wants for the graph, at most one per CPU core)")
    add(train, "train", "--scheduler", default=None,
        help="address of an existing Dask scheduler, or 'sync' to run every task in this "
             "process (default: an embedded cluster). On any of them each task runs torch "
             "with as many threads as its role's CPU count (1 unless --resources "
             "ROLE=CPU:N) and numpy's BLAS with one")
    add(train, "train", "--adapt", default=None, metavar="MIN:MAX",
        help="grow and shrink the embedded cluster (or a --cluster pool) between MIN and MAX "
             "workers through Dask's adaptive scaling: one more while the learner waits for "
             "rollouts most of 3 iterations in a row, up to one per actor; one fewer while "
             "it hardly waits. Starts with MIN; a worker that joins gets replicas at the next "
             "iteration, one that leaves is the lost-worker path")
    add(train, "train", "--tls", action="store_true",
        help="encrypt comms: temporary credentials for the embedded cluster, or "
             "--tls-ca-file/--tls-cert/--tls-key for --scheduler tls://...")
    add(train, "train", "--tls-ca-file", default=None, help="CA certificate (PEM)")
    add(train, "train", "--tls-cert", default=None, help="client certificate (PEM)")
    add(train, "train", "--tls-key", default=None, help="client private key (PEM)")
    add(train, "train", "--resources", action="append", default=[],
        metavar="ROLE=KEY:N[,KEY:N]",
        help="override a role's resources, e.g. learner=GPU:1 (repeatable)")
    add(train, "train", "--track", choices=("tensorboard", "mlflow"), default="tensorboard",
        help="where else the run is recorded: TensorBoard events (OUT/tb) are always written; "
             "mlflow also records it in MLflow at the end (params, metrics by env step, "
             "artifacts) in a local folder, OUT/../mlruns, or $MLFLOW_TRACKING_URI; needs "
             "pip install 'daskrl[mlflow]' (default: tensorboard)")
    add(train, "train", "--config", type=Path, default=None, metavar="FILE.yaml",
        help="graph settings from a YAML file (a run's OUT/config.yaml, or keys named like "
             "GRAPH's Config fields); flags on the line override it")
    add(train, "train", "--out", type=Path, default=None,
        help="output folder (default: runs/<graph>-<time>)")
    add(train, "train", "--resume", action="store_true",
        help="continue from --out's newest checkpoint; a larger --steps extends the run, "
             "and the learning-rate schedule goes on from the value it had reached, linearly "
             "to its end value at the new last iteration (kept as 'schedule' in summary.json "
             "and the checkpoints; an annealed schedule that already ended stays at 0: "
             "pass --no-anneal-lr to train on at --learning-rate)")
    add(train, "train", "--report", type=Path, default=None, metavar="FILE.html",
        help="save Dask's performance report of the run (task stream, worker profiles, "
             "bandwidth); needs a Dask scheduler, so not with --scheduler sync")
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
    add(train, "train", "--eval-every", type=int, default=0, metavar="N",
        help="evaluate the policy every N iterations in a task of its own (the evaluate "
             "role's resources), written to metrics.csv and TensorBoard; the best is kept "
             "as OUT/checkpoints/best.pt (default: 0, never)")
    add(train, "train", "--task-timeout", type=float, default=None, metavar="SECONDS",
        help="a task running longer, or a worker silent longer, is reported with its stack "
             "and its worker restarted, then the iteration resubmitted (default: max(10 x the "
             "median of the role's recent task times, 60 s); not with --scheduler sync)")
    add(train, "train", "--max-recoveries", type=int, default=3, metavar="N",
        help="lost or hung workers survived in a row (no iteration finished between) "
             "before the run stops (default: 3)")
    add(train, "train", "--replan-timeout", type=float, default=30.0, metavar="SECONDS",
        help="after a worker is lost, how long the run waits for workers that can host its "
             "fragments again before it stops (default: 30; longer where replacements are "
             "batch jobs that queue; 0: stop at once)")
    add(train, "train", "--max-restarts", type=int, default=0, metavar="N",
        help="times the embedded cluster is started again from the last checkpoint when its "
             "scheduler or every worker dies (default: 0)")
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
    sweep = _sweep_flags(sub, subparser, epilog, names, add)
    flags["sweep"] += [s for a in add_jobqueue_flags(sweep) for s in a.option_strings]
    status = sub.add_parser("sweep-status", help="every trial of a sweep: state, steps, return",
                            description="Print a sweep's trials (from OUT/sweep.json, and the "
                                        "metrics of those training now): state, env steps, "
                                        "latest training return, final greedy return.",
                            allow_abbrev=False)
    status.add_argument("sweep_dir", type=Path, metavar="OUT",
                        help="the --out folder of a `daskrl sweep`")
    league = sub.add_parser("league", help="the league table of a graphs/league.py run",
                            description="Print the league of a run's latest checkpoint: each "
                                        "member's OpenSkill rating (mu +- sigma, ranked by "
                                        "mu - 3 sigma), the learning policy's win rate "
                                        "against it and the games played; --plot also draws "
                                        "the ratings over the run.",
                            allow_abbrev=False)
    league.add_argument("run_dir", type=Path, metavar="RUN",
                        help="the --out folder of a `daskrl train graphs/league.py` run")
    league.add_argument("--plot", type=Path, default=None, metavar="FILE",
                        help="also write the ratings over time to FILE (.png, .svg or .pdf)")
    plot = sub.add_parser("plot", help="learning curves of a run folder (PNG and SVG)",
                          description="Write returns, speed and losses figures (.png and .svg) "
                                      "for a run: returns raw and smoothed with evaluation "
                                      "points, env steps per second of each iteration, one "
                                      "panel per loss on its own scale.",
                          allow_abbrev=False)
    plot.add_argument("run_dir", type=Path, help="the --out folder of a training run")
    plot.add_argument("--out", type=Path, default=None, help="where to write (default: run_dir)")
    prof = sub.add_parser("profile", help="where an iteration's time goes, and the bottleneck",
                          description="Break a run's iteration time into env stepping, "
                                      "inference, learning and scheduler/transfer/idle.",
                          allow_abbrev=False)
    prof.add_argument("run_dir", type=Path, help="the --out folder of a training run")
    ev = sub.add_parser("eval", help="run a trained policy's episodes on fresh envs",
                        description="Load RUN's policy (its newest checkpoint, --checkpoint "
                                    "FILE or --best) and run episodes on fresh envs; print the "
                                    "mean ± std of return and length.",
                        allow_abbrev=False)
    ev.add_argument("run_dir", type=Path, metavar="RUN", help="the --out folder of a training run")
    _policy_flags(ev)
    ev.add_argument("--episodes", type=int, default=10, help="episodes to run (default: 10)")
    ev.add_argument("--seed", type=int, default=0,
                    help="episode i resets with seed S+i; seeds sampled actions (default: 0)")
    ev.add_argument("--env", default=None, metavar="ID",
                    help="evaluate on another gymnasium env id with the same observations "
                         "(default: the run's)")
    ev.add_argument("--video", type=Path, default=None, metavar="DIR",
                    help="record every episode to DIR/*.mp4 through gymnasium's RecordVideo "
                         "(needs the video extra: pip install 'daskrl[video]')")
    ev.add_argument("--opponent", choices=("random",), default=None,
                    help="multi-agent runs: play each trained team against a random one")
    exp = sub.add_parser("export", help="write a trained policy as a torch.export archive",
                         description="Write RUN's policy as a torch.export archive (.pt2) that "
                                     "plain torch runs without daskrl: "
                                     "torch.export.load(FILE).module()(obs_batch) -> actions.",
                         allow_abbrev=False)
    exp.add_argument("run_dir", type=Path, metavar="RUN",
                     help="the --out folder of a training run")
    exp.add_argument("--out", type=Path, default=None, metavar="FILE.pt2",
                     help="archive to write (default: RUN/policy.pt2)")
    _policy_flags(exp)
    rep = sub.add_parser("replay", help="re-run a failed task in this process",
                         description="Run the fragment call saved in OUT/failures/<task>.pkl "
                                     "again in this process (breakpoint() works), after "
                                     "printing its original traceback. The file holds pickled "
                                     "code: replay only files from runs you trust.",
                         allow_abbrev=False)
    rep.add_argument("file", type=Path, help="a file from a run's failures/ folder")
    rep.add_argument("--pdb", action="store_true", help="open pdb where the replay raises")
    return parser, flags


def _sweep_flags(sub: Any, subparser: dict[str, Any], epilog: str, names: str,
                 add: Any) -> argparse.ArgumentParser:
    """``daskrl sweep``'s parser and run flags (``add(parser, "sweep", *names, **kwargs)``)."""
    sweep = sub.add_parser(
        "sweep", help="many runs of a graph on one cluster: seeds, a grid, a search, PBT",
        description="Train many runs of GRAPH on one Dask cluster, at most --concurrency at "
                    "once, each in OUT/<trial>/ with the usual files; OUT/sweep.json records "
                    "them, OUT/report.md/.json and OUT/curves.png report the interquartile "
                    "mean with 95 % bootstrap intervals per configuration (rliable). Needs "
                    "pip install 'daskrl[sweep]'. Settings of GRAPH's Config on the line apply "
                    "to every trial.",
        epilog=epilog.replace("daskrl train", "daskrl sweep"), **subparser)
    add(sweep, "sweep", "graph", help="graph script, e.g. graphs/ppo.py")
    add(sweep, "sweep", "--seeds", type=int, default=1, metavar="N",
        help="seeds of each configuration: --seed to --seed+N-1 (default: %(default)s)")
    add(sweep, "sweep", "--seed", type=int, default=1,
        help="the first seed; also seeds the search's sampler and PBT (default: %(default)s)")
    add(sweep, "sweep", "--grid", action="append", default=[], metavar="KEY=V1,V2,...",
        help="a Config field and its values (repeatable): every combination is trained "
             "with every seed, e.g. --grid learning_rate=2.5e-4,1e-3")
    add(sweep, "sweep", "--search", choices=("optuna",), default=None,
        help="propose --trials configurations from --space with Optuna; trials whose "
             "periodic evaluation falls below the median of earlier ones are pruned")
    add(sweep, "sweep", "--trials", type=int, default=20,
        help="trials of a --search (default: %(default)s)")
    add(sweep, "sweep", "--space", action="append", default=[],
        metavar="KEY=LOW:HIGH[:log] | KEY=V1,V2",
        help="what --search or --pbt draws (repeatable), e.g. learning_rate=1e-4:1e-2:log")
    add(sweep, "sweep", "--sampler", choices=("tpe", "random"), default="tpe",
        help="Optuna's sampler (default: %(default)s)")
    add(sweep, "sweep", "--pruner", choices=("median", "none"), default="median",
        help="Optuna's pruner, fed by each trial's --eval-every evaluations (default: "
             "%(default)s; with --eval-every 0 about eight evaluations per trial)")
    add(sweep, "sweep", "--pbt", action="store_true",
        help="population-based training: every --interval iterations the bottom "
             "--quantile copies a top member's checkpoint and moves its --space settings by "
             "x0.8 or x1.2 (only the graph's Config.MID_RUN settings)")
    add(sweep, "sweep", "--population", type=int, default=8,
        help="members of --pbt (default: %(default)s)")
    add(sweep, "sweep", "--interval", type=int, default=None, metavar="ITERATIONS",
        help="iterations between --pbt rounds (default: a tenth of the run)")
    add(sweep, "sweep", "--start", action="append", default=[], metavar="KEY=V1,V2,...",
        help="--pbt members' first values of a --space setting, cycled over the members "
             "(repeatable; default: drawn from --space)")
    add(sweep, "sweep", "--quantile", type=float, default=0.25,
        help="share of the --pbt population replaced, and copied from (default: %(default)s)")
    add(sweep, "sweep", "--concurrency", type=int, default=None, metavar="K",
        help="trials training at once (default: twice the cluster's workers)")
    add(sweep, "sweep", "--workers", type=int, default=None,
        help="worker processes of the embedded cluster (default: one per CPU core)")
    add(sweep, "sweep", "--scheduler", default=None,
        help="address of an existing Dask scheduler (default: an embedded cluster)")
    add(sweep, "sweep", "--steps", type=int, default=500_000,
        help="env steps of each trial (default: %(default)s)")
    add(sweep, "sweep", "--distribution", default=None,
        help=f"placement policy of each trial (default: the graph's own); names: {names}")
    add(sweep, "sweep", "--eval-every", type=int, default=0, metavar="N",
        help="evaluate each trial every N iterations (default: 0, only at the end)")
    add(sweep, "sweep", "--checkpoint-every", type=int, default=10,
        help="iterations per checkpoint of each trial (default: %(default)s)")
    add(sweep, "sweep", "--deterministic", action="store_true",
        help="bit-identical trials for their seeds whatever the workers")
    add(sweep, "sweep", "--resources", action="append", default=[],
        metavar="ROLE=KEY:N[,KEY:N]", help="override a role's resources (repeatable)")
    add(sweep, "sweep", "--out", type=Path, default=None,
        help="the sweep's folder (default: runs/sweep-<graph>-<time>)")
    add(sweep, "sweep", "--resume", action="store_true",
        help="continue the sweep in --out: finished trials are kept, the others go on from "
             "their checkpoints")
    add(sweep, "sweep", "--no-progress", dest="progress", action="store_false",
        help="no progress bar")
    return sweep


def _policy_flags(parser: argparse.ArgumentParser) -> None:
    """Which checkpoint, and greedy or sampled actions: flags of ``eval`` and ``export``."""
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--checkpoint", default=None, metavar="FILE",
                       help="a checkpoint file, or its name under RUN/checkpoints "
                            "(default: the newest)")
    which.add_argument("--best", action="store_true",
                       help="RUN/checkpoints/best.pt, the best periodic evaluation's")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--deterministic", dest="deterministic", action="store_true",
                      default=True, help="greedy actions (the default)")
    mode.add_argument("--sample", dest="deterministic", action="store_false",
                      help="actions sampled from the policy's distribution")


def graph_index(argv: Sequence[str]) -> int | None:
    """Where the graph script stands in a ``train``/``graph`` command line: the first word
    after the command that is not a flag and names a ``.py`` file."""
    if not argv or argv[0] not in GRAPH_COMMANDS:
        return None
    return next((i for i, word in enumerate(argv) if i > 0 and not word.startswith("-")
                 and word.endswith(".py")), None)


def graph_path(argv: Sequence[str]) -> str | None:
    """The graph script of a ``train``/``graph`` command line, wherever it stands.

    Examples
    --------
    >>> graph_path(["train", "--steps", "1000", "graphs/ppo.py", "--num-envs", "4"])
    'graphs/ppo.py'
    >>> graph_path(["plot", "runs/x"]) is None
    True
    """
    index = graph_index(argv)
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
    index = graph_index(argv)
    if index is None:
        args, extras = run_parser()[0].parse_known_args(argv)
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
    parser, run_flags = run_parser(
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
    base = None
    if command == "train" and args.config is not None:
        try:
            base = config_from_dict(module.Config, read_yaml(args.config), f"--config "
                                    f"{args.config}")
        except ValueError as exc:
            raise UserError(str(exc)) from None
    return args, module, parse_config(module.Config, rest, prog, default=base)
