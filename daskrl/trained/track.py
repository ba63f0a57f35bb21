"""A finished run recorded in MLflow (``daskrl train --track mlflow``): its config as params,
every ``metrics.csv`` row as metrics at its env step, and the run folder's summary, config and
plots as artifacts. TensorBoard events are written during every run whatever ``--track`` says.

MLflow keeps runs in a local folder, ``OUT/../mlruns`` by default (no server); its file store
is in maintenance mode in MLflow 3, so it is allowed explicitly here unless the environment
names another tracking URI (``MLFLOW_TRACKING_URI``, e.g. a server or ``sqlite:///mlflow.db``).
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any

from daskrl.observe.metrics import read_summary
from daskrl.observe.plot import read_metrics

__all__ = ["log_run_mlflow"]


def _params(summary: dict[str, Any]) -> dict[str, str]:
    """The config's fields and the run's identity as MLflow params (strings, at most 6,000
    characters each)."""
    params = {f"config.{k}": json.dumps(v) if not isinstance(v, str) else v
              for k, v in (summary.get("config") or {}).items()}
    for key in ("graph", "algorithm", "distribution", "seed", "deterministic"):
        if key in summary:
            params[key] = str(summary[key])
    return {k: v[:6000] for k, v in params.items()}


def log_run_mlflow(run_dir: str | Path, tracking_uri: str | None = None,
                   experiment: str = "daskrl") -> str:
    """Record the run in ``run_dir`` as one MLflow run; return its run id.

    Raises
    ------
    ValueError
        When MLflow is not installed (one line naming the extra).

    Examples
    --------
    >>> log_run_mlflow("runs/ppo-20260101-000000")  # doctest: +SKIP
    '3f2c...'
    """
    try:
        from mlflow.entities import Metric, Param
        from mlflow.tracking import MlflowClient
    except ImportError:
        raise ValueError("--track mlflow needs MLflow: pip install 'daskrl[mlflow]'") from None
    out = Path(run_dir).resolve()
    uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
    if uri is None:
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")  # a folder, no server
        uri = (out.parent / "mlruns").as_uri()
    client = MlflowClient(tracking_uri=uri)
    found = client.get_experiment_by_name(experiment)
    exp_id = found.experiment_id if found is not None else client.create_experiment(experiment)
    summary = read_summary(out)
    run = client.create_run(exp_id, run_name=out.name, tags={"daskrl.out": str(out)})
    run_id = run.info.run_id
    data = read_metrics(out)
    stamp = int(time.time() * 1000)
    steps = data.get("env_steps") or data.get("iteration") or []
    metrics = []
    for col, values in data.items():
        if col in ("iteration", "env_steps"):
            continue
        for i, v in enumerate(values):
            if not math.isnan(v) and i < len(steps) and not math.isnan(steps[i]):
                metrics.append(Metric(col, v, stamp, int(steps[i])))
    params = [Param(k, v) for k, v in _params(summary).items()]
    for i in range(0, len(params), 100):  # MLflow's limits per batch
        client.log_batch(run_id, params=params[i:i + 100])
    for i in range(0, len(metrics), 1000):
        client.log_batch(run_id, metrics=metrics[i:i + 1000])
    for name in ("summary.json", "config.yaml", "metrics.csv", "returns.png", "losses.png",
                 "speed.png"):
        if (out / name).is_file():
            client.log_artifact(run_id, str(out / name))
    final = {k: float(v) for k, v in summary.items()
             if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}
    if final:
        client.log_batch(run_id, metrics=[Metric(f"summary/{k}", v, stamp, 0)
                                          for k, v in final.items()])
    client.set_terminated(run_id)
    return run_id
