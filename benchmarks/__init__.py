"""Benchmarks of maskfit's training step against stock Keras."""
