"""Fragments: an algorithm's functions, each with a role, resources and a replica count."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from daskrl.core.resources import Resources

_ROLE = re.compile(r"^[a-z][a-z_]*$")


def check_role(role: str) -> str:
    """Validate a role name: lower-case letters and ``_`` (it becomes the dashboard's task prefix).

    Examples
    --------
    >>> check_role("learner")
    'learner'
    """
    if not isinstance(role, str) or not _ROLE.match(role):
        raise ValueError(
            f"role {role!r} is not valid: use lower-case letters and '_' only (e.g. 'rollout'); "
            "it names the fragment's tasks in the dashboard"
        )
    return role


@dataclass(frozen=True)
class Fragment:
    """A plain function that runs as Dask tasks with one role and one resource annotation.

    Parameters
    ----------
    fn : callable
        The function a task calls.
    role : str
        What it does (``rollout``, ``learner``, ``inference``, ``evaluate``...); tasks are
        keyed ``<role>-<replica>-it<k>-<run>`` so the dashboard groups them by role.
    resources : Resources
        What each replica needs from its worker.
    replicas : int
        How many copies run per iteration.
    apart_from : tuple of str
        Roles whose workers this role's replicas avoid when another worker offers its
        resources (e.g. a learner that should run beside, not after, the rollouts).

    Examples
    --------
    >>> Fragment(print, "rollout", Resources(cpu=1), replicas=2).replicas
    2
    """

    fn: Callable[..., Any]
    role: str
    resources: Resources = Resources(cpu=1)
    replicas: int = 1
    apart_from: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not callable(self.fn):
            raise TypeError(f"fragment {self.role!r}: fn must be callable, got {self.fn!r}")
        check_role(self.role)
        if not isinstance(self.resources, Resources):
            raise TypeError(
                f"fragment {self.role!r}: resources must be daskrl.Resources, "
                f"got {type(self.resources).__name__}"
            )
        if isinstance(self.replicas, bool) or not isinstance(self.replicas, int) or (
            self.replicas < 1
        ):
            raise ValueError(
                f"fragment {self.role!r}: replicas must be an int >= 1, got {self.replicas!r}"
            )


def setting(text: str, default: Any) -> Any:
    """A graph ``Config`` field with its ``--help`` text (the CLI makes it a flag).

    Examples
    --------
    >>> from dataclasses import dataclass, fields
    >>> @dataclass
    ... class Config:
    ...     num_envs: int = setting("envs per replica", 8)
    >>> fields(Config)[0].metadata["help"]
    'envs per replica'
    """
    return field(default=default, metadata={"help": text})
