"""Networks initialised from torch's global generator, one construction at a time per
process.

``torch.nn`` initialises weights from torch's process-wide generator. A learner seeds it and
builds its networks; two learners built at once in one process (the drivers of a sweep's
trials are threads of one process, as are thread workers) would draw from it in turns and
get weights that depend on the timing. :func:`seeded_init` serialises the constructions.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import torch

_lock = threading.RLock()  # re-entrant: a learner's base class may build networks too


@contextmanager
def seeded_init(seed: int) -> Iterator[None]:
    """Seed torch's global generator with ``seed`` and hold it for the modules built
    inside: no other thread of this process seeds or draws from it through here meanwhile.

    Examples
    --------
    >>> with seeded_init(3):
    ...     a = torch.nn.Linear(2, 2).weight.detach().clone()
    >>> with seeded_init(3):
    ...     b = torch.nn.Linear(2, 2).weight.detach().clone()
    >>> bool(torch.equal(a, b))
    True
    """
    with _lock:
        torch.manual_seed(seed)
        yield
