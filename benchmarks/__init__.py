"""Benchmarks: absl entry points that time maskfit against a baseline.

Each benchmark is a package, `benchmarks.<name>`: its `__main__.py` holds its
flags (`python -m benchmarks.<name> --helpfull`), its `lib.py` the library
(`Config`, `run(config, workdir)`, the table). They share `benchmarks.harness`
(contenders timed in turn, paired ratios, the machine), `benchmarks.hlo` (what
XLA compiles a step into: fusions, kernels, bytes accessed) and the experiments'
scaffolding, `experiments.common` (flags from a config, `main`, JSON, data
sets, the structured-pruning networks); they import nothing else from
`experiments` but the public `Config` and `run` of the experiments they time.

The packages sit in two folders, by what they compare, and this package's
`__path__` lists both, so that each is `benchmarks.<name>` whatever its folder
(`scale`, which measures maskfit's own cost as a model grows, sits here):

- `step/`: the training step of `MaskedModel` against stock Keras:
  `step_time`, `freezing`, `layerwise_rates`, `sparse_step_time`,
  `unit_pruning_step`, `fractional_masks`, `jax_step_time`, `torch_step_time`.
- `versus/`: maskfit against another library or program: `pruning_vs_tfmot`
  (TF-MOT), `structured_vs_torch_pruning` (Torch-Pruning), `shrunk_latency`
  (hand-shrunk networks), `resume_exactness` (Keras's `BackupAndRestore`),
  `seed_scenarios` (the seeds' own code).
"""

import os

__path__ += [
    os.path.join(os.path.dirname(__file__), group) for group in ("step", "versus")
]
