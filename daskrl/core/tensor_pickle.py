"""CPU tensors pickled as numpy arrays, for what a learner task returns.

Pickle hands a numpy array's memory to Dask's comms as it is, where a tensor pickles through
``torch.save`` per storage; the result of every iteration is fetched while the next one
computes, so the cheaper this is, the less it takes from the next iteration
(:class:`daskrl.core.algorithm.LearnerOutput` packs its fields with it).
"""

from __future__ import annotations

import pickle
from typing import Any

import torch


class _PackedTensor:
    """A CPU tensor carried as a numpy array (:func:`pack_tensors`)."""

    __slots__ = ("array",)

    def __init__(self, array: Any) -> None:
        self.array = array

    def __getstate__(self) -> Any:
        return self.array

    def __setstate__(self, array: Any) -> None:
        self.array = array


def pack_tensors(value: Any, memo: dict[int, Any]) -> Any:
    """``value`` with every CPU tensor inside dicts, lists and tuples replaced by its numpy
    array (wrapped, so that :func:`unpack_tensors` turns it back); ``memo`` packs an object
    met twice once.

    Examples
    --------
    >>> w = {"a": torch.ones(2)}
    >>> unpack_tensors(pack_tensors({"model": w, "weights": w}, {}))["weights"]
    {'a': tensor([1., 1.])}
    """
    if isinstance(value, torch.Tensor):
        if (value.device.type == "cpu" and value.layout == torch.strided
                and not value.requires_grad and value.dtype in _NUMPY_DTYPES):
            return _PackedTensor(value.numpy())
        return value
    if type(value) in (dict, list, tuple):  # subclasses pickle as they are
        if id(value) not in memo:
            items = value.items() if isinstance(value, dict) else enumerate(value)
            packed = {k: pack_tensors(v, memo) for k, v in items}
            memo[id(value)] = packed if isinstance(value, dict) else type(value)(
                packed.values())
        return memo[id(value)]
    return value


def unpack_tensors(value: Any) -> Any:
    """The inverse of :func:`pack_tensors` (arrays back to tensors, sharing their memory)."""
    if isinstance(value, _PackedTensor):
        array = value.array
        return torch.from_numpy(array if array.flags.writeable else array.copy())
    if type(value) is dict:
        return {k: unpack_tensors(v) for k, v in value.items()}
    if type(value) in (list, tuple):
        return type(value)(unpack_tensors(v) for v in value)
    return value


def to_bytes(value: Any) -> bytes:
    """``value`` (a state dict, say) pickled once, its tensors as numpy arrays: a payload that
    Dask sends to each reader as it is, where a dict of tensors is serialised anew for every
    fetch (``benchmarks/scale_actors.md``: milliseconds for a small policy's weights).

    Examples
    --------
    >>> from_bytes(to_bytes({"w": torch.arange(3)}))
    {'w': tensor([0, 1, 2])}
    """
    return pickle.dumps(pack_tensors(value, {}), protocol=pickle.HIGHEST_PROTOCOL)


def from_bytes(payload: bytes) -> Any:
    """The inverse of :func:`to_bytes`."""
    return unpack_tensors(pickle.loads(payload))


_NUMPY_DTYPES = (torch.float32, torch.float64, torch.float16, torch.int64, torch.int32,
                 torch.int16, torch.int8, torch.uint8, torch.bool)
