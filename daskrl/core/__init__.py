"""The vocabulary: Algorithm and its roles, Resources, fragments, placement and task keys,
the task bodies of each role, worker-resident state and failure capture."""
