"""League ratings with OpenSkill's Plackett-Luce model (a Bayesian skill rating, as
TrueSkill): each member has a mean ``mu`` and an uncertainty ``sigma``."""

from __future__ import annotations

from typing import Any

from openskill.models import PlackettLuce

_MODEL = PlackettLuce()


def new_rating(mu: float | None = None, sigma: float | None = None) -> dict[str, float]:
    """A rating as plain numbers (OpenSkill's defaults: ``mu`` 25, ``sigma`` 25/3).

    Examples
    --------
    >>> r = new_rating(); round(r["mu"], 2), round(r["sigma"], 3)
    (25.0, 8.333)
    """
    r = _MODEL.rating(mu=mu, sigma=sigma)
    return {"mu": float(r.mu), "sigma": float(r.sigma)}


def rate_game(a: dict[str, float], b: dict[str, float], score: float,
              b_fixed: bool = False) -> tuple[dict[str, float], dict[str, float]]:
    """Both ratings after one game that ``a`` scored ``score`` in (1 win, 0.5 draw, 0 loss).

    ``b_fixed`` keeps ``b`` as it was (an anchor, such as the uniformly random player).

    Examples
    --------
    >>> a, b = rate_game(new_rating(), new_rating(), 1.0)
    >>> a["mu"] > 25 > b["mu"], a["sigma"] < 8.34
    (True, True)
    >>> _, b2 = rate_game(new_rating(), new_rating(), 0.0, b_fixed=True)
    >>> b2["mu"]
    25.0
    """
    ra = _MODEL.rating(mu=a["mu"], sigma=a["sigma"])
    rb = _MODEL.rating(mu=b["mu"], sigma=b["sigma"])
    ranks = [0, 0] if score == 0.5 else ([0, 1] if score > 0.5 else [1, 0])
    (na,), (nb,) = _MODEL.rate([[ra], [rb]], ranks=ranks)
    after_b: dict[str, Any] = dict(b) if b_fixed else {"mu": float(nb.mu),
                                                       "sigma": float(nb.sigma)}
    return {"mu": float(na.mu), "sigma": float(na.sigma)}, after_b


def ordinal(rating: dict[str, float]) -> float:
    """A conservative skill figure, ``mu - 3 sigma`` (what a league table ranks by)."""
    return rating["mu"] - 3.0 * rating["sigma"]
