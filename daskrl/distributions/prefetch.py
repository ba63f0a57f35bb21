"""Batches staged on the learner's device ahead of the update that uses them.

A learner on its own clock should find its next batch where it computes (SRL's prefetch):
a background step turns each batch that lands into tensors on the learner's device while
the learner is still updating on the previous one.

- CUDA: each array is copied into pinned (page-locked) host memory, then to the device with
  ``non_blocking=True`` on a copy stream of its own, so the copy overlaps the update running
  on the compute stream; a CUDA event recorded after the copies is waited on by the stream
  that uses the batch (:meth:`Staged.ready`), and the tensors are marked as used there so
  their memory is not reused while the update reads them.
- CPU: the arrays become tensors without a copy (``torch.as_tensor`` over a contiguous
  array), so the learner's collation (``batch_tensors``) finds them ready; what the
  background step saves here is the wait for the batch's transfer and deserialisation, which
  :func:`distributed.as_completed` does before the batch is staged.

``stats`` and ``moments`` (metadata the learner reads on the host) stay as they are.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from daskrl.core.algorithm import Batch

HOST_KEYS = ("stats", "moments")
"""Batch entries that stay on the host as they are."""


@dataclass
class Staged:
    """A batch whose arrays are tensors on ``device``, and the event after their copies
    (None on the CPU: nothing to wait for)."""

    batch: Batch
    device: torch.device
    event: Any = None

    def ready(self) -> Batch:
        """The batch, safe to use on the calling thread's current stream."""
        if self.event is not None:
            stream = torch.cuda.current_stream(self.device)
            stream.wait_event(self.event)
            for value in self.batch.values():
                if torch.is_tensor(value):
                    value.record_stream(stream)
        return self.batch


class DeviceStager:
    """Stages batches on ``device`` (:class:`Staged`); CUDA copies on a stream of its own.

    Examples
    --------
    >>> stager = DeviceStager("cpu")
    >>> batch = {"obs": np.ones((2, 3), np.float32), "stats": {"env_steps": 6}}
    >>> ready = stager(batch).ready()
    >>> type(ready["obs"]).__name__, ready["obs"].shape, ready["stats"]
    ('Tensor', torch.Size([2, 3]), {'env_steps': 6})
    """

    def __init__(self, device: str | torch.device) -> None:
        self.device = torch.device(device)
        self.stream = (torch.cuda.Stream(self.device)
                       if self.device.type == "cuda" and torch.cuda.is_available() else None)

    def __call__(self, batch: Batch) -> Staged:
        """``batch`` with every array a tensor on the device (copies under way on CUDA)."""
        if self.stream is None:
            out = {k: v if k in HOST_KEYS or not isinstance(v, np.ndarray)
                   else torch.as_tensor(np.ascontiguousarray(v), device=self.device)
                   for k, v in batch.items()}
            return Staged(out, self.device)
        out = {}
        with torch.cuda.stream(self.stream):
            for k, v in batch.items():
                if k in HOST_KEYS or not isinstance(v, np.ndarray):
                    out[k] = v
                    continue
                host = torch.from_numpy(np.ascontiguousarray(v)).pin_memory()
                out[k] = host.to(self.device, non_blocking=True)
            event = torch.cuda.Event()
            event.record(self.stream)
        return Staged(out, self.device, event)
