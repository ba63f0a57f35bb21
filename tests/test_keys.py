"""Task keys name their role first and their run last: every key of each distribution's
drawn iteration, and each builder of :mod:`daskrl.core.keys` (which the tasks submitted at
run time, such as the IMPALA clock's rollouts, also use).

The dashboard groups tasks by the text before the first dash (``dask.utils.key_split``);
the watchdog and the timeline find a run's tasks by the key's end. A key built by hand
in another order would hide a run's tasks from both without an error.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from dask.utils import key_split

from daskrl.core.keys import in_iteration, of_runs, role_of, step_key, task_key, version_key
from daskrl.observe.render import iteration_graph

ROOT = Path(__file__).resolve().parents[1]

CASES = [  # (graph, distribution): one graph each distribution draws
    ("ppo.py", "single"), ("ppo.py", "actors-learner"), ("ppo.py", "actors-learner:stale=1"),
    ("ppo.py", "central-inference"), ("ppo.py", "data-parallel"), ("a3c.py", "async"),
    ("impala.py", "impala"), ("impala.py", "impala:batch=2"), ("dqn.py", "apex"),
]


@pytest.mark.parametrize(("graph", "distribution"), CASES)
def test_every_key_names_its_role_first_and_its_run_last(graph, distribution):
    sketch, *_ = iteration_graph(str(ROOT / "graphs" / graph), distribution, iteration=3)
    keys = [str(k) for k in sketch.__dask_graph__()]
    assert len(keys) > 1
    for key in keys:
        assert role_of(key) == key_split(key), key  # what the dashboard groups it under
        assert of_runs(["run"])(key) and not of_runs(["other"])(key), key
    # every task but the previous iteration's stand-in belongs to iteration 3
    assert {k for k in keys if not in_iteration(k, 3)} == {"learner-0-it2-run"}


def test_the_builders_agree_with_the_readers():
    run = "0f3e2a1b-ab12cd34"  # an IMPALA clock's channel: a uuid, then the run
    for key in (task_key("learner", 0, 7, run), step_key("rollout", 1, 7, 4, run),
                version_key("publish", 3, 7, run)):
        assert role_of(key) == key_split(key) == key.split("-")[0]
        assert of_runs(["ab12cd34"])(key) and in_iteration(key, 7)
        assert not of_runs(["0f3e2a1b"])(key) and not in_iteration(key, 17)
