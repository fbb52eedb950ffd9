"""What users declare on layers: mask specs, schedules, rules, and their config.

- `masks`: `OutputMask`, `ElementMask` (what may learn, as plain data).
- `schedule`: `PiecewiseMask` and the one interval lookup of a schedule.
- `pruning_schedule`: `PruningSchedule`, `ConstantSparsity`, `PolynomialDecay`
  (TF-MOT's), shared by `maskfit.pruning` and `maskfit.structured`.
- `declare`: `set_mask` / `get_mask`, stored on layer objects.
- `gate`: the `backprop=True` gate on a layer's outputs.
- `rules`: `MaskRule` (keep masks recomputed in the step, e.g. pruning),
  `set_rule` / `get_rule`.
- `layerwise`: `layerwise_decay`, `layerwise_depths` (multipliers decay^depth),
  over `depth`, which finds the blocks of any model.
- `recipes`: fine-tuning recipes over the masks (`bitfit`, `train_only`,
  `train_embedding_rows`, `sparse_finetune`, `probe_then_finetune`).
- `config`: masks and rules in a model's config, by layer path.
- `config_value`: `ConfigValue`, equality and repr from `get_config()`.
- `version`: the one counter that changes when any declaration does.

It imports `internals`, `units`, `checks`, `paths` and `support`: nothing of
the step, the optimizer or the model, which read the declarations.
"""
