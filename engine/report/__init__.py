"""What rank 0 shows its user about a run: TensorBoard curves, progress, the end-of-run summary."""
