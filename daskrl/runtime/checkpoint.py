"""Checkpoints written atomically (temp file + rename) and loaded with ``weights_only``."""

from __future__ import annotations

import io
import os
import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

_NAME = re.compile(r"^ckpt-(\d{8})\.pt$")


def save_checkpoint(
    directory: Path, iteration: int, payload: dict[str, Any], keep: int = 3
) -> Path:
    """Write ``ckpt-<iteration>.pt`` atomically and keep only the newest ``keep`` files.

    Examples
    --------
    >>> import tempfile; d = Path(tempfile.mkdtemp())
    >>> save_checkpoint(d, 5, {"x": torch.zeros(1)}).name
    'ckpt-00000005.pt'
    """
    directory.mkdir(parents=True, exist_ok=True)
    final = _write_atomically(directory / f"ckpt-{iteration:08d}.pt", payload)
    older = [p for p in list_checkpoints(directory) if p.name < final.name]
    for old in older[: max(0, len(older) - (keep - 1))] if keep > 0 else []:
        old.unlink(missing_ok=True)  # never the file just written, nor newer ones
    return final


BEST = "best.pt"
"""The checkpoint of the best periodic evaluation, beside the ``ckpt-*.pt`` files."""


def save_best(directory: Path, payload: dict[str, Any]) -> Path:
    """Write ``best.pt`` atomically (``payload`` carries its ``"eval"`` entry).

    Examples
    --------
    >>> import tempfile; d = Path(tempfile.mkdtemp())
    >>> save_best(d, {"eval": {"eval_return_mean": 9.5, "iteration": 4}}).name
    'best.pt'
    >>> best_eval(d)
    {'eval_return_mean': 9.5, 'iteration': 4}
    """
    directory.mkdir(parents=True, exist_ok=True)
    return _write_atomically(directory / BEST, payload)


def best_eval(directory: Path) -> dict[str, float] | None:
    """The ``"eval"`` entry of ``best.pt``: its ``eval_return_mean`` and ``iteration`` (None
    without one; a damaged one is reported on stderr and counts as none, so the next
    evaluation replaces it)."""
    path = directory / BEST
    if not path.is_file():
        return None
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
        entry = payload["eval"]
        return {"eval_return_mean": float(entry["eval_return_mean"]),
                "iteration": int(entry["iteration"])}
    except Exception as exc:  # noqa: BLE001 - any damage: replaced by the next evaluation
        print(f"daskrl: warning: {path} does not load ({_reason(exc)}); the next evaluation "
              "replaces it", file=sys.stderr)
        return None


def _write_atomically(final: Path, payload: dict[str, Any]) -> Path:
    """torch.save to a temp file in the same folder, fsync, rename over ``final``.

    The payload is serialised in memory first: torch's zip writer turns a failed write (disk
    full, file too large) into a ``RuntimeError`` about positions, while a plain write raises
    the ``OSError`` that says what is wrong.
    """
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    fd, tmp = tempfile.mkstemp(dir=final.parent, prefix=".tmp-", suffix=".pt")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(buffer.getbuffer())
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, final)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return final


def list_checkpoints(directory: Path) -> list[Path]:
    """Complete checkpoints in ``directory``, oldest first."""
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir() if _NAME.match(p.name))


def load_latest(directory: Path) -> dict[str, Any] | None:
    """The newest checkpoint that loads, or None when there is none (damaged files skipped).

    Examples
    --------
    >>> import tempfile; d = Path(tempfile.mkdtemp())
    >>> load_latest(d) is None
    True
    """
    try:
        return load_for_resume(directory).payload
    except (CheckpointsUnreadable, FileNotFoundError):
        return None


class CheckpointsUnreadable(ValueError):
    """Checkpoint files exist but none loads: a resume must not start over on top of them."""


@dataclass(frozen=True)
class Loaded:
    """The checkpoint a resume continues from, and the newer files it had to skip."""

    payload: dict[str, Any]
    path: Path
    skipped: list[tuple[Path, str]]
    """``(file, why it did not load)``, newest first."""

    def warning(self) -> str | None:
        """One line naming each skipped file and why, or None when none was skipped."""
        if not self.skipped:
            return None
        why = "; ".join(f"{p.name}: {reason}" for p, reason in self.skipped)
        return (f"daskrl: warning: skipped damaged checkpoint(s) ({why}); continuing from "
                f"{self.path.name}")


def load_for_resume(directory: Path) -> Loaded:
    """The newest checkpoint in ``directory`` that loads, and the newer ones that did not.

    Raises
    ------
    FileNotFoundError
        When ``directory`` holds no ``ckpt-*.pt`` file at all.
    CheckpointsUnreadable
        When it holds some but none loads; the message names each file and why, so the
        run folder can be repaired by hand instead of being overwritten by a fresh start.

    Examples
    --------
    >>> import tempfile; d = Path(tempfile.mkdtemp())
    >>> _ = save_checkpoint(d, 1, {"it": 1}); _ = (d / "ckpt-00000002.pt").write_bytes(b"x")
    >>> loaded = load_for_resume(d)
    >>> loaded.path.name, loaded.payload, [p.name for p, _ in loaded.skipped]
    ('ckpt-00000001.pt', {'it': 1}, ['ckpt-00000002.pt'])
    """
    found = list_checkpoints(directory)
    if not found:
        raise FileNotFoundError(f"no checkpoints under {directory}")
    skipped: list[tuple[Path, str]] = []
    for path in reversed(found):
        try:
            payload = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:  # noqa: BLE001 - a damaged file: fall back to the one before
            skipped.append((path, _reason(exc)))
            continue
        return Loaded(payload, path, skipped)
    listing = "; ".join(f"{p} ({reason})" for p, reason in skipped)
    raise CheckpointsUnreadable(
        f"--resume: no checkpoint under {directory} loads: {listing}; nothing was changed - "
        "restore a good checkpoint there, or start a new run with another --out")


def _reason(exc: BaseException) -> str:
    """The first line of why ``torch.load`` refused a file."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")[:200]
