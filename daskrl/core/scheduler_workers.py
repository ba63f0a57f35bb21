"""What the scheduler knows of its workers now, asked afresh.

``Client.scheduler_info(n_workers=-1)`` is not safe for this: it stores the scheduler's
answer on the client and returns the stored copy, and the client's own periodic refresh
(every 2 s, asking for no workers) can overwrite that copy in between, so the caller
sometimes gets ``"workers": {}``. Asking ``identity`` directly returns this call's answer.
"""

from __future__ import annotations

from typing import Any

from distributed import Client


def scheduler_workers(client: Client, timeout: float = 30) -> dict[str, dict[str, Any]]:
    """Worker address -> what the scheduler knows of it now (name, resources, memory limit),
    asked afresh; a scheduler that does not answer within ``timeout`` s raises.

    Examples
    --------
    >>> from distributed import LocalCluster
    >>> with LocalCluster(n_workers=1, processes=False, dashboard_address=None) as cluster, \\
    ...         Client(cluster) as client:
    ...     [w["nthreads"] > 0 for w in scheduler_workers(client).values()]
    [True]
    """
    return client.sync(client.scheduler.identity, n_workers=-1,
                       callback_timeout=timeout)["workers"]
