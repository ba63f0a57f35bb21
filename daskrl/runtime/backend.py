"""Where iteration graphs run: a Dask cluster, or Dask's synchronous scheduler in-process.

The names of the execution backends, in one place:

- :mod:`daskrl.runtime.engine`: the :class:`Backend` protocol the driver talks to, its
  :class:`Handle` and :class:`Activity`;
- :mod:`daskrl.runtime.dask_backend`: :class:`DaskBackend`, a ``distributed.Client``;
- :mod:`daskrl.runtime.sync_backend`: :class:`SyncBackend`, ``--scheduler sync``;
- :mod:`daskrl.runtime.membership`: workers joining and leaving, as the scheduler reports them;
- :mod:`daskrl.runtime.scheduler_calls`: what the Dask backend runs on the scheduler.
"""

from __future__ import annotations

from daskrl.runtime.dask_backend import DaskBackend
from daskrl.runtime.engine import Activity, Backend, Handle
from daskrl.runtime.membership import MEMBERSHIP_TOPIC, Membership, MembershipPlugin
from daskrl.runtime.scheduler_calls import TaskClock, expected_restrictions
from daskrl.runtime.sync_backend import SyncBackend

__all__ = ["MEMBERSHIP_TOPIC", "Activity", "Backend", "DaskBackend", "Handle", "Membership",
           "MembershipPlugin", "SyncBackend", "TaskClock", "expected_restrictions"]
