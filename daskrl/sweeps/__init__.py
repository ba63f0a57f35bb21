"""Many runs of one graph on one Dask cluster: seeds, grids, Optuna searches and
population-based training (:func:`~daskrl.sweeps.sweep.sweep`, ``daskrl sweep``), their
record (``sweep.json``), report (IQM with bootstrap intervals, learning curves) and status
(``daskrl sweep-status``)."""
