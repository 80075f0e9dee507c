"""Recorded steps: a decode or verify step replayed from a CUDA graph per padded batch bucket."""
