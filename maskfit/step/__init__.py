"""The masking stage of a training step.

- `declared`: the declared specs resolved against a step's variables.
- `plan`: `StepPlan`, which variables the compiled step leaves out, masks
  and restores, for the steps ahead.
- `mask_state`: the declared masks as `tf.Variable` state, and masking a
  gradient.
- `rule_state`, `rule_update`, `rule_stage`: the rules' keep masks as state,
  a rule's update in the step, and where the rules run.
- `update`: the guarded update (snapshot, `optimizer.apply`, restore).
- `masker`: `GradientMasker`, which runs the stage's parts in order.
- `lifecycle`: `StepLifecycle`, when the step is planned, traced, settled
  and prepared.
- `split`: under XLA, a step with rules compiled with and without their
  updates, one picked per step.
"""
