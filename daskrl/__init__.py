"""daskrl: reinforcement learning as resource-annotated Dask task graphs.

An algorithm is written once as fragments (rollout, inference, learner, evaluation); a
distribution turns them into one iteration's delayed graph; Dask's distributed scheduler
places each task on a worker that offers its resources.

The names below load on first use, so ``daskrl train`` can start its cluster's workers
while the driver is still importing torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_WHERE = {
    "Actor": "core.algorithm", "Algorithm": "core.algorithm", "Learner": "core.algorithm",
    "LearnerOutput": "core.algorithm", "Fragment": "core.fragment", "setting": "core.fragment",
    "Placement": "core.placement", "plan_placement": "core.placement", "task": "core.placement",
    "task_key": "core.keys", "Resources": "core.resources",
    "parse_resources": "core.resources", "resident": "core.worker_state",
    "Sizes": "core.sizes", "load_policy": "trained.load", "train": "api", "Run": "api",
    "sweep": "sweeps.sweep",
}

__all__ = [
    "Actor", "Algorithm", "Fragment", "Learner", "LearnerOutput", "Placement", "Resources",
    "Run", "Sizes", "load_policy", "parse_resources", "plan_placement", "resident", "setting",
    "sweep", "task", "task_key", "train",
]

if TYPE_CHECKING:
    from daskrl.api import Run, train
    from daskrl.core.algorithm import Actor, Algorithm, Learner, LearnerOutput
    from daskrl.core.fragment import Fragment, setting
    from daskrl.core.keys import task_key
    from daskrl.core.placement import Placement, plan_placement, task
    from daskrl.core.resources import Resources, parse_resources
    from daskrl.core.sizes import Sizes
    from daskrl.core.worker_state import resident
    from daskrl.sweeps.sweep import sweep
    from daskrl.trained.load import load_policy


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'daskrl' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_WHERE])
