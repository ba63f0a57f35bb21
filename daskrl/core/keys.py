"""Task keys, built and read in one place.

Every task of a run has a key ``<role>-<what>-it<k>[-s<step>]-<run>``:

- the role comes first, so the dashboard, which groups tasks by the text before the first
  dash (``dask.utils.key_split``), shows ``rollout``, ``learner``, ``env``...;
- the run id comes last, so the driver finds a run's tasks (the watchdog's hang search, the
  timeline's task stream) by suffix alone. A run id may hold dashes (an IMPALA clock's
  channel is ``<uuid>-<run>``): only its end has to be the run's.

Build keys with :func:`task_key`, :func:`step_key` and :func:`version_key`; read them
with :func:`role_of`, :func:`of_runs` and :func:`in_iteration` (on string keys: daskrl
names every task it submits; only ``role_of`` also reads Dask's tuple keys). An
evaluation's key carries the weights version in its ``it<k>`` slot.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable


def task_key(role: str, replica: int, iteration: int, run: str) -> str:
    """The key of one task, ``<role>-<replica>-it<k>-<run>``; the dashboard shows ``<role>``.

    Examples
    --------
    >>> task_key("rollout", 3, 7, "1a2b3c4d")
    'rollout-3-it7-1a2b3c4d'
    """
    return f"{role}-{replica}-it{iteration}-{run}"


def step_key(role: str, replica: int | str, iteration: int, step: int, run: str) -> str:
    """Key of a task inside an iteration, ``<role>-<replica>-it<k>-s<step>-<run>``.

    Examples
    --------
    >>> step_key("env", "1g0", 3, 5, "1a2b3c4d")
    'env-1g0-it3-s5-1a2b3c4d'
    """
    return f"{role}-{replica}-it{iteration}-s{step}-{run}"


def version_key(role: str, version: int, iteration: int, run: str) -> str:
    """Key of a learner task that makes weights version ``version``,
    ``<role>-v<version>-it<k>-<run>`` (an update, a publication, an applied gradient).

    Examples
    --------
    >>> version_key("publish", 4, 2, "1a2b3c4d")
    'publish-v4-it2-1a2b3c4d'
    """
    return f"{role}-v{version}-it{iteration}-{run}"


def role_of(key: object) -> str:
    """The role a key names (what the dashboard groups it under).

    Examples
    --------
    >>> role_of("rollout-0-it2-s1-0f3e2a1b-ab12cd34"), role_of(("learner-0-it1-r", 0))
    ('rollout', 'learner')
    """
    text = key[0] if isinstance(key, tuple) else key
    return str(text).split("-", 1)[0]


def of_runs(runs: Iterable[str]) -> Callable[[object], bool]:
    """Whether a key is a task of one of ``runs`` (its run id is the key's end): a test
    made once for a stream of keys.

    Examples
    --------
    >>> mine = of_runs(["ab12cd34"])
    >>> mine("rollout-0-it2-s1-0f3e2a1b-ab12cd34"), mine("learner-0-it2-ab12cd34")
    (True, True)
    >>> of_runs(["cd34"])("learner-0-it2-ab12cd34")  # a run id is a whole part
    False
    """
    ends = tuple(f"-{run}" for run in runs)
    return lambda key: str(key).endswith(ends)


def in_iteration(key: object, iteration: int) -> bool:
    """Whether ``key`` is a task of iteration ``iteration`` (0-based).

    Examples
    --------
    >>> in_iteration("env-1g0-it3-s5-ab12cd34", 3), in_iteration("env-1g0-it13-s5-ab", 3)
    (True, False)
    """
    return f"-it{iteration}-" in str(key)
