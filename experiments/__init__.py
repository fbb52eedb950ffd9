"""Experiments: absl entry points over library functions `run(config, workdir)`."""
