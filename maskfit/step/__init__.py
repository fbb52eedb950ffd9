"""The masking stage of a training step.

- `declared`: the masks declared on layers, resolved against a step's
  variables (`DeclaredMask`).
- `plan`: `StepPlan`, which variables the compiled step leaves out, masks
  and restores, for the steps ahead.
- `mask_state`: the declared masks as `tf.Variable` state, and masking a
  gradient.
- `rules/`: the mask rules in the step (`keeps`, `update`, `runner`); the
  masker holds a `rules.runner.RuleRunner`.
- `pipeline`: the stage in its one order (`run`), over the step's
  `StepView` and `UpdateMode`.
- `update`: the guarded update (snapshot, `optimizer.apply`, restore).
- `masker`: `GradientMasker`, the stage's state and parts.
- `lifecycle`: `StepLifecycle`, when the step is planned, traced, settled
  and prepared.
- `split`: under XLA, a step with rules compiled with and without their
  updates, one picked per step.
- `stateless`: the masking stage as a pure function in `keras.ops`, which
  the JAX backend runs.

It imports `internals`, `spec`, `optim` and `paths`, never `model`,
`backend` or the products above them.
"""
