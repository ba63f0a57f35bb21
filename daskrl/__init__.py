"""daskrl: reinforcement learning as resource-annotated Dask task graphs.

An algorithm is written once as fragments (rollout, inference, learner, evaluation); a
distribution turns them into one iteration's delayed graph; Dask's distributed scheduler
places each task on a worker that offers its resources.
"""

from .algorithm import Actor, Algorithm, Learner, LearnerOutput
from .fragment import Fragment, setting
from .graph import Placement, plan_placement, task, task_key
from .resources import Resources, parse_resources
from .state import resident

__version__ = "0.1.0"

__all__ = [
    "Actor",
    "Algorithm",
    "Fragment",
    "Learner",
    "LearnerOutput",
    "Placement",
    "Resources",
    "parse_resources",
    "plan_placement",
    "resident",
    "setting",
    "task",
    "task_key",
]
