"""Where workers come from: the embedded LocalCluster, a scheduler address, and
dask-jobqueue pools (Slurm, PBS)."""
