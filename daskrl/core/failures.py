"""A fragment that raises leaves its inputs behind, so one command replays it in-process.

Every task of an iteration graph calls its fragment through :class:`Call`. When the
fragment raises, the exception carries the pickled call (function, inputs, the worker's
traceback) back to the driver, which writes it to ``OUT/failures/<task key>.pkl``;
``daskrl replay FILE`` runs that one call again in this process, where ``breakpoint()``
and ``--pdb`` work.
"""

from __future__ import annotations

import os
import pdb
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cloudpickle
import numpy as np
from distributed import Reschedule

from daskrl.core.worker_state import task_threads

_ATTR = "daskrl_failure"


class Call:
    """A fragment function as a task calls it: on an exception, the call is kept.

    Examples
    --------
    >>> call = Call(divmod, "learner-0-it0-r")
    >>> call(7, 2), call.__name__
    ((3, 1), 'divmod')
    >>> try:
    ...     call(1, 0)
    ... except ZeroDivisionError as exc:
    ...     failure(exc)["key"]
    'learner-0-it0-r'
    """

    def __init__(self, fn: Callable[..., Any], key: str, threads: int = 0) -> None:
        self.fn, self.key, self.threads = fn, key, threads
        self.__name__ = getattr(fn, "__name__", type(fn).__name__)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # the task's CPU grant (0: a call inside a task keeps its task's); in a driver's own
        # process the caller's counts come back afterwards
        with task_threads(self.threads):
            return self._call(*args, **kwargs)

    def _call(self, *args: Any, **kwargs: Any) -> Any:
        if args and getattr(args[0], "deterministic", False) is True:
            deterministic_torch()
        try:
            # NaN/inf is caught where it matters: the driver stops on a non-finite loss with
            # one line naming the cause; numpy's warnings on the way there are only noise
            with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
                return self.fn(*args, **kwargs)
        except Reschedule:  # not a failure: the task is sent again
            raise
        except Exception as exc:
            if not hasattr(exc, _ATTR):  # the innermost fragment's call is the useful one
                setattr(exc, _ATTR, _pack(self.fn, self.key, args, kwargs, exc))
            raise

    def __repr__(self) -> str:
        return f"Call({self.__name__}, {self.key!r})"


def deterministic_torch() -> None:
    """Make torch in this process bit-reproducible: one intra-op thread (sums in one
    order whatever the machine), deterministic algorithms (cuBLAS workspace set for CUDA).

    Examples
    --------
    >>> deterministic_torch()  # doctest: +SKIP
    """
    import torch

    if torch.get_num_threads() != 1:
        torch.set_num_threads(1)
    if not torch.are_deterministic_algorithms_enabled():
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)


def _pack(fn: Callable[..., Any], key: str, args: tuple, kwargs: dict, exc: Exception
          ) -> bytes:
    from daskrl.core.worker_state import worker_name

    record: dict[str, Any] = {
        "key": key, "error": f"{type(exc).__name__}: {exc}", "worker": worker_name(),
        "traceback": traceback.format_exc(), "time": time.time(),
    }
    try:
        return cloudpickle.dumps({**record, "fn": fn, "args": args, "kwargs": kwargs})
    except Exception as why:  # noqa: BLE001 - unpicklable inputs: keep what can be kept
        return cloudpickle.dumps({**record, "unpicklable": f"{type(why).__name__}: {why}"})


class PeerLost(ConnectionError):
    """A task's direct link to a task on another worker broke (that worker is presumably
    lost): the driver resubmits as it does when it sees a worker leave."""


class StopAsked(Exception):
    """Raised inside a run its caller asked to stop (``Run.stop`` from Python): like Ctrl-C,
    the run ends as stopped, with a checkpoint, not as failed."""


class RunStopped(RuntimeError):
    """The run stopped for a reason its message states in one line (a writer that failed,
    a hang past the recoveries allowed); the last good checkpoint is kept."""


class FragmentTypeError(TypeError):
    """A fragment returned something other than its role's contract: one line names the
    role, the call and what was expected."""


def expect(value: Any, role: str, call: str, kind: type, keys: tuple[str, ...] = ()) -> None:
    """Raise :class:`FragmentTypeError` unless ``value`` is a ``kind`` holding ``keys``.

    Examples
    --------
    >>> expect({"stats": {}}, "rollout", "the actor's rollout(steps)", dict, ("stats",))
    >>> expect([1, 2], "rollout", "the actor's rollout(steps)", dict, ("stats",))
    ... # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    daskrl.core.failures.FragmentTypeError: the rollout fragment: ... returned list; ...
    """
    want = f"a {kind.__name__}" + (f" with {', '.join(map(repr, keys))}" if keys else "")
    if not isinstance(value, kind):
        raise FragmentTypeError(f"the {role} fragment: {call} returned "
                                f"{type(value).__name__}; expected {want}")
    missing = [k for k in keys if k not in value]
    if missing:
        raise FragmentTypeError(f"the {role} fragment: {call} returned a {kind.__name__} "
                                f"without {', '.join(map(repr, missing))}; expected {want}")


class FragmentError(RuntimeError):
    """A fragment raised; the message says where its inputs were saved and how to replay."""


def failure(exc: BaseException) -> dict[str, Any] | None:
    """The call an exception from a fragment carries, or None."""
    blob = getattr(exc, _ATTR, None)
    return cloudpickle.loads(blob) if isinstance(blob, bytes) else None


def save_failure(exc: BaseException, directory: Path) -> Path | None:
    """Write the failed call ``exc`` carries to ``directory/<key>.pkl``; its path, or None."""
    blob = getattr(exc, _ATTR, None)
    if not isinstance(blob, bytes):
        return None
    key = cloudpickle.loads(blob)["key"]
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{key}.pkl"
    path.write_bytes(blob)
    return path


def load_failure(path: Path) -> dict[str, Any]:
    """Read a failure file written by :func:`save_failure`.

    Raises
    ------
    ValueError
        When the file is not a failure record (only load files from runs you trust: it
        holds pickled code).
    """
    try:
        record = cloudpickle.loads(Path(path).read_bytes())
    except FileNotFoundError:
        raise
    except Exception as exc:  # noqa: BLE001 - any unpickling error means a bad file
        raise ValueError(f"{path} is not a daskrl failure file: {exc}") from None
    if not isinstance(record, dict) or "key" not in record or "traceback" not in record:
        raise ValueError(f"{path} is not a daskrl failure file")
    return record


def replay(path: Path, post_mortem: bool = False) -> Any:
    """Print the original traceback, then run the failed fragment again in this process.

    Returns the fragment's result when it does not fail this time; otherwise its exception
    propagates (or, with ``post_mortem``, a debugger opens where it was raised).

    Examples
    --------
    >>> replay(Path("runs/ppo/failures/rollout-0-it3-1a2b3c4d.pkl"))  # doctest: +SKIP
    """
    record = load_failure(path)
    print(f"{record['key']} failed on worker {record['worker']!r}: {record['error']}\n"
          f"original traceback:\n{record['traceback']}", file=sys.stderr)
    if "unpicklable" in record:
        raise ValueError(f"{path}: the task's inputs could not be saved "
                         f"({record['unpicklable']}), so it cannot be replayed")
    print(f"replaying {record['key']} in this process ...", file=sys.stderr)
    try:
        return record["fn"](*record["args"], **record["kwargs"])
    except Exception:
        if post_mortem:
            pdb.post_mortem(sys.exc_info()[2])
        raise
