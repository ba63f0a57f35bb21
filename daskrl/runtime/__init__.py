"""What runs a training: the driver and its run loop, backends (Dask, sync), the
recorder, checkpoints and the memory check.

The backends: :mod:`~daskrl.runtime.engine` declares the ``Backend`` protocol the driver
talks to (with its ``Handle`` and ``Activity``); :mod:`~daskrl.runtime.dask_backend` serves it
with a ``distributed.Client``, :mod:`~daskrl.runtime.sync_backend` in this process
(``--scheduler sync``); :mod:`~daskrl.runtime.membership` follows workers joining and leaving
and :mod:`~daskrl.runtime.scheduler_calls` holds what the Dask backend runs on the scheduler.
"""
