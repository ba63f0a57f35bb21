"""What a run shows: metrics (CSV + TensorBoard), the time profile, plots and
pictures of iteration graphs."""
