"""Identity of a policy's weights: equal digests mean bit-identical policies."""

from __future__ import annotations

import hashlib

import torch


def weights_sha256(weights: dict[str, torch.Tensor]) -> str:
    """SHA-256 of a state dict: names, dtypes, shapes and bytes, in name order.

    Equal for two bit-identical policies, whatever device or process they came from.

    Examples
    --------
    >>> w = {"b": torch.zeros(2), "a": torch.ones(1)}
    >>> weights_sha256(w) == weights_sha256(dict(reversed(list(w.items()))))
    True
    >>> len(weights_sha256(w))
    64
    """
    h = hashlib.sha256()
    for name in sorted(weights):
        t = weights[name].detach().to("cpu").contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()
