"""Pure torch/numpy kernels of the algorithms: no Dask inside."""
