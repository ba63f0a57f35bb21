"""What runs a training: the driver and its run loop, backends (Dask, sync), the
recorder, checkpoints and the memory check."""
