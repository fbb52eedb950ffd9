"""Benchmarks: absl entry points that time maskfit against a baseline."""
