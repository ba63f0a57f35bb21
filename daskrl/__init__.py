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
    "Actor": "algorithm", "Algorithm": "algorithm", "Learner": "algorithm",
    "LearnerOutput": "algorithm", "Fragment": "fragment", "setting": "fragment",
    "Placement": "graph", "plan_placement": "graph", "task": "graph", "task_key": "graph",
    "Resources": "resources", "parse_resources": "resources", "resident": "state",
}

__all__ = [
    "Actor", "Algorithm", "Fragment", "Learner", "LearnerOutput", "Placement", "Resources",
    "parse_resources", "plan_placement", "resident", "setting", "task", "task_key",
]

if TYPE_CHECKING:
    from .algorithm import Actor, Algorithm, Learner, LearnerOutput
    from .fragment import Fragment, setting
    from .graph import Placement, plan_placement, task, task_key
    from .resources import Resources, parse_resources
    from .state import resident


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'daskrl' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_WHERE])
