"""The algorithms' numerical parts (losses, networks, learners, actors, GAE): no Dask inside."""
