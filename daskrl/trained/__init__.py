"""A finished run's policy as a product: load it, evaluate it, export it, record it."""
