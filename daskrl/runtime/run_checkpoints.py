"""What a run keeps as it goes: checkpoints of finished iterations, ``best.pt``, and what a
stopped run truly kept (named in its last line)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from daskrl.core.algorithm import LearnerOutput
from daskrl.core.failures import RunStopped
from daskrl.runtime.checkpoint import list_checkpoints, save_checkpoint
from daskrl.runtime.settings import RunSettings


def kept_checkpoint(out: Path, last_done: LearnerOutput) -> str:
    """What a stopped run keeps, truly: the last finished iteration (checkpointed on the
    way out), an earlier checkpoint, or nothing.

    Examples
    --------
    >>> import tempfile
    >>> kept_checkpoint(Path(tempfile.mkdtemp()), LearnerOutput(0, {}, {}, {}))
    'no iteration finished, so no checkpoint was written'
    """
    if last_done.metrics:
        return (f"iteration {last_done.version} is checkpointed in "
                f"{out / 'checkpoints'}; continue with --resume")
    found = list_checkpoints(out / "checkpoints")
    if found:
        return f"the last checkpoint is {found[-1]}; continue with --resume"
    return "no iteration finished, so no checkpoint was written"


def check_finite(it: int, output: LearnerOutput, out: Path, last_done: LearnerOutput) -> None:
    """Stop on a NaN/inf loss before it reaches a checkpoint."""
    for j, metrics in enumerate([*output.history, output.metrics]):
        bad = {k: v for k, v in metrics.items()
               if k.startswith("losses/") and isinstance(v, float) and not math.isfinite(v)
               and k != "losses/explained_variance"}
        if bad:
            raise FloatingPointError(
                f"iteration {it + j + 1}: non-finite loss {bad}; training stopped - "
                f"{kept_checkpoint(out, last_done)} - lower --learning-rate or "
                "--max-grad-norm, or check the env's rewards for NaN/inf")


def checkpoint_iteration(settings: RunSettings, output: LearnerOutput,
                         counters: dict[str, float]) -> None:
    """Checkpoint a finished iteration (the learner's version counts iterations)."""
    if not output.metrics:
        return  # nothing trained since the start or the resume
    with writing(settings.out / "checkpoints"):
        save_checkpoint(settings.out / "checkpoints", output.version,
                        payload(settings, output, counters), keep=settings.keep_checkpoints)


@contextmanager
def writing(directory: Path) -> Iterator[None]:
    """A checkpoint that cannot be written (disk full, read-only folder) stops the run in one
    line naming the last good one (the atomic write left it as it was)."""
    try:
        yield
    except OSError as exc:
        found = list_checkpoints(directory)
        kept = (f"the last good checkpoint is {found[-1]}" if found else
                "no checkpoint was written")
        raise RunStopped(f"cannot write a checkpoint in {directory} ({exc.strerror or exc}): "
                         f"the run stopped; {kept}; free space or fix the folder's "
                         "permissions, then continue with --resume") from exc


def payload(settings: RunSettings, output: LearnerOutput, counters: dict[str, float]
             ) -> dict[str, Any]:
    """A checkpoint's content (the learner's version counts iterations)."""
    return {"version": output.version, "iteration": output.version, "learner": output.state,
            "actors": output.actors, "coordinator": output.coordinator, "counters": counters,
            "meta": settings.meta}
