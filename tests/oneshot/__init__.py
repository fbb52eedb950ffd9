"""Tests of maskfit.oneshot: one-shot pruning (magnitude, Wanda, SparseGPT) and healing."""
