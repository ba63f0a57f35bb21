"""``daskrl export``: a trained policy as a self-contained ``torch.export`` archive.

``torch.export`` rather than TorchScript: ``torch.jit.script`` is deprecated in the torch this
package runs on (it warns on every call), while an exported program is the format torch keeps
developing, needs no Python class to load, and records the batch dimension as dynamic, so
``torch.export.load(path).module()(obs)`` runs any batch size with nothing but torch
installed. The archive is a ``.pt2`` file (``torch.export.load`` warns on other names).
The policy's ``deterministic`` choice is fixed at export: greedy by default, sampling (from
torch's global generator) with ``--sample``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from daskrl.trained.load import TrainedRun, obs_spec

__all__ = ["export_policy"]


def export_policy(run: TrainedRun, path: str | Path, deterministic: bool = True) -> Path:
    """Write ``run``'s policy to ``path`` (a ``.pt2`` archive) and return the path.

    Load it without daskrl: ``torch.export.load(path).module()(obs_batch) -> actions``.

    Examples
    --------
    >>> export_policy(load_run("runs/ppo-x"), "policy.pt2")  # doctest: +SKIP
    PosixPath('policy.pt2')
    """
    path = Path(path)
    if path.suffix != ".pt2":
        raise ValueError(f"--out {path}: a torch.export archive is a .pt2 file (torch.export."
                         f"load warns on other names); use --out {path.with_suffix('.pt2')}")
    if path.is_dir():
        raise ValueError(f"--out {path} is a folder: name the file to write, e.g. "
                         f"{path / 'policy.pt2'}")
    spec = obs_spec(run.algo.env_id)
    if spec is None:
        raise ValueError(f"{run.out}: the run's env ({run.algo.env_id or run.algo.name}) is "
                         "not a gymnasium env id, so the observation shape to export for is "
                         "unknown; export supports single-agent gymnasium runs")
    module = run.module(deterministic)
    example = torch.as_tensor(np.zeros((2, *spec[0]), spec[1]))  # batch 2: 1 would specialise
    batch = torch.export.Dim("batch")
    program = torch.export.export(module, (example,), dynamic_shapes=({0: batch},))
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.export.save(program, str(path))
    return path
