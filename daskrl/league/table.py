"""``daskrl league RUN``: the league table of a run's latest checkpoint, and its ratings over
time (the learning policy's from ``metrics.csv``, each snapshot's at the version it froze)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from daskrl.league.coordinator import league_table
from daskrl.observe.plot import read_metrics
from daskrl.runtime.checkpoint import load_latest


def read_league(run_dir: Path) -> tuple[dict[str, Any], int]:
    """The league kept in ``run_dir``'s latest checkpoint and that checkpoint's iteration.

    Raises
    ------
    FileNotFoundError
        When the folder has no checkpoint.
    ValueError
        When its checkpoint holds no league (a run of another graph).
    """
    payload = load_latest(Path(run_dir) / "checkpoints")
    if payload is None:
        raise FileNotFoundError(f"{run_dir} has no checkpoint: give the --out folder of a "
                                "`daskrl train graphs/league.py` run")
    league = payload.get("coordinator") or {}
    if "members" not in league and "teams" not in league:
        raise ValueError(f"{run_dir}'s checkpoint holds no league: it is not a run of "
                         "graphs/league.py")
    return league, int(payload["iteration"])


def format_table(league: dict[str, Any], iteration: int) -> str:
    """The league table as text: rating ``mu ± sigma``, the ordinal it is ranked by, the
    learning policy's (decayed) win rate against each member, games and results. A two-team
    league (``{"teams": ...}``) prints one table per team: its learning policy (``main``)
    and the other team's snapshots it plays.

    Examples
    --------
    >>> from daskrl.league.coordinator import LeagueSettings, new_league
    >>> print(format_table(new_league(LeagueSettings()), 0))  # doctest: +NORMALIZE_WHITESPACE
    league after iteration 0: 2 players
    name            kind      rating         ordinal  main wins  games  won  drawn
    main            learner   25.00 ± 8.33     0.00          -      0    -      -
    random          random    25.00 ± 8.33     0.00       0.50      0    0      0
    """
    if "teams" in league:
        return "\n\n".join(
            f"team {team}: its learning policy (main) and the opponents it plays\n"
            + format_table(one, iteration) for team, one in league["teams"].items())
    rows = league_table(league)
    lines = [f"league after iteration {iteration}: {len(rows)} players",
             f"{'name':15} {'kind':9} {'rating':14} {'ordinal':>7}  {'main wins':>9}  "
             f"{'games':>5}  {'won':>3}  {'drawn':>5}"]
    for r in rows:
        learner = r["name"] == "main"
        rate = "-" if math.isnan(r["main_win_rate"]) else f"{r['main_win_rate']:.2f}"
        lines.append(f"{r['name']:15} {r['kind']:9} {r['mu']:5.2f} ± {r['sigma']:5.2f}  "
                     f"{r['ordinal']:7.2f}  {rate:>9}  {r['games']:5d}  "
                     f"{'-' if learner else r['won']:>3}  {'-' if learner else r['drawn']:>5}")
    return "\n".join(lines)


def plot_ratings(run_dir: Path, out: Path) -> Path:
    """Ratings over the run: the learning policy's ``mu`` with a ``± sigma`` band from
    ``metrics.csv``, and each snapshot's current rating at the iteration it froze."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    league, _ = read_league(run_dir)
    columns = read_metrics(Path(run_dir))
    its = columns.get("iteration", [])
    fig, ax = plt.subplots(figsize=(7, 4))
    teams = league.get("teams") or {"": league}
    for team, one in teams.items():
        column = f"league/{team}/" if team else "league/"
        mu = columns.get(f"{column}rating_mu", [])
        sigma = columns.get(f"{column}rating_sigma", [])
        label = f"{team} learning policy (mu)" if team else "learning policy (mu)"
        if mu:
            ax.plot(its, mu, label=label)
            ax.fill_between(its, [m - s for m, s in zip(mu, sigma, strict=True)],
                            [m + s for m, s in zip(mu, sigma, strict=True)], alpha=0.2)
        snaps = [m for m in one["members"] if m["kind"] == "snapshot"]
        if snaps:  # a team's table holds the other team's snapshots
            ax.errorbar([m["version"] for m in snaps], [m["rating"]["mu"] for m in snaps],
                        yerr=[m["rating"]["sigma"] for m in snaps], fmt="o", ms=4,
                        label=f"snapshots met by {team} (now)" if team else "snapshots (now)")
    ax.set_xlabel("iteration")
    ax.set_ylabel("OpenSkill rating")
    ax.legend(loc="best")
    ax.set_title("league ratings")
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out
