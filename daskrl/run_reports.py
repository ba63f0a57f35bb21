"""The ``daskrl`` commands that read a finished run or sweep: ``eval``, ``export``,
``league``, ``sweep-status``, ``profile``, ``replay`` and ``plot`` (:data:`REPORTS`)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from daskrl.core.script import UserError


def cmd_eval(args: argparse.Namespace) -> int:
    """Run ``daskrl eval``: the run's policy on fresh envs, mean ± std printed."""
    from daskrl.core.algorithm import EvalRequest
    from daskrl.trained.evaluate import evaluate_run, format_result
    from daskrl.trained.load import load_run

    try:
        run = load_run(args.run_dir, args.checkpoint, args.best)
        request = EvalRequest(episodes=args.episodes, seed=args.seed,
                              deterministic=args.deterministic, video_dir=args.video,
                              env_id=args.env, opponent=args.opponent)
        result = evaluate_run(run, request)
    except (FileNotFoundError, ValueError) as exc:
        raise UserError(str(exc)) from None
    mode = "greedy" if args.deterministic else "sampled"
    print(f"{run.checkpoint} (iteration {run.iteration}, {mode} actions)", file=sys.stderr)
    print(format_result(result))
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    """Run ``daskrl export``: the run's policy as a ``torch.export`` archive."""
    from daskrl.trained.export import export_policy
    from daskrl.trained.load import load_run

    try:
        run = load_run(args.run_dir, args.checkpoint, args.best)
        path = export_policy(run, args.out or run.out / "policy.pt2", args.deterministic)
    except (FileNotFoundError, ValueError) as exc:
        raise UserError(str(exc)) from None
    print(f"wrote {path} (from {run.checkpoint}); load it with plain torch: "
          f"torch.export.load({str(path)!r}).module()(obs_batch)")
    return 0


def cmd_sweep_status(args: argparse.Namespace) -> int:
    """Run ``daskrl sweep-status``: every trial of a sweep."""
    from daskrl.sweeps.status import status_table

    try:
        print(status_table(args.sweep_dir))
    except FileNotFoundError as exc:
        raise UserError(str(exc)) from None
    return 0


def cmd_league(args: argparse.Namespace) -> int:
    """Run ``daskrl league``: a league's table, and its ratings over time with ``--plot``."""
    from daskrl.league.table import format_table, plot_ratings, read_league

    try:
        print(format_table(*read_league(args.run_dir)))
        if args.plot is not None:
            print(f"wrote {plot_ratings(args.run_dir, args.plot)}")
    except (FileNotFoundError, ValueError) as exc:
        raise UserError(str(exc)) from None
    return 0


def cmd_profile(args: argparse.Namespace) -> int:
    """Run ``daskrl profile``: where a run's iteration time goes."""
    from daskrl.observe.profile import report

    try:
        print(report(args.run_dir))
    except (FileNotFoundError, ValueError) as exc:
        raise UserError(str(exc)) from None
    return 0


def cmd_replay(args: argparse.Namespace) -> int:
    """Run ``daskrl replay``: a failed task again, in this process."""
    from daskrl.core.failures import load_failure, replay

    try:
        record = load_failure(args.file)
    except (FileNotFoundError, ValueError) as exc:
        raise UserError(str(exc)) from None
    if "unpicklable" in record:
        raise UserError(f"{args.file}: the task's inputs could not be saved "
                        f"({record['unpicklable']}), so it cannot be replayed")
    replay(args.file, post_mortem=args.pdb)
    print(f"{args.file}: the replay finished without an error this time", file=sys.stderr)
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    """Run ``daskrl plot``: a run's learning curves."""
    from daskrl.observe.plot import plot_run

    try:
        for path in plot_run(args.run_dir, args.out):
            print(f"wrote {path}")
    except (FileNotFoundError, ValueError) as exc:
        raise UserError(str(exc)) from None
    return 0


REPORTS: dict[str, Callable[[argparse.Namespace], int]] = {
    "eval": cmd_eval, "export": cmd_export, "league": cmd_league,
    "sweep-status": cmd_sweep_status, "profile": cmd_profile, "replay": cmd_replay,
    "plot": cmd_plot}
"""Each read-only command's handler, by the command's name."""
