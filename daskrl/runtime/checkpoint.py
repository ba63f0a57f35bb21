"""Checkpoints written atomically (temp file + rename) and loaded with ``weights_only``."""

from __future__ import annotations

import os
import re
import tempfile
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
    final = directory / f"ckpt-{iteration:08d}.pt"
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=".pt")
    try:
        with os.fdopen(fd, "wb") as fh:
            torch.save(payload, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, final)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    older = [p for p in list_checkpoints(directory) if p.name < final.name]
    for old in older[: max(0, len(older) - (keep - 1))] if keep > 0 else []:
        old.unlink(missing_ok=True)  # never the file just written, nor newer ones
    return final


def list_checkpoints(directory: Path) -> list[Path]:
    """Complete checkpoints in ``directory``, oldest first."""
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir() if _NAME.match(p.name))


def load_latest(directory: Path) -> dict[str, Any] | None:
    """The newest checkpoint that loads, or None when there is none."""
    for path in reversed(list_checkpoints(directory)):
        try:
            return torch.load(path, map_location="cpu", weights_only=True)
        except Exception:  # noqa: BLE001 - a damaged file: fall back to the one before
            continue
    return None
