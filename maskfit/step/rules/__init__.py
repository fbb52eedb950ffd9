"""The mask rules inside a training step: their keep masks, updates and places.

A rule (`maskfit.spec.rules.MaskRule`) recomputes keep masks in the step;
these three modules are everything the step does for rules, and the masker
reaches them only through `runner.RuleRunner`:

- `keeps`: `RuleKeeps`, the rules' keep masks as `tf.Variable` state, and
  which rules a step traced at a given optimizer step runs.
- `update`: a rule's update of its keep masks (`apply`, `RuleRun`, `start`):
  joint keep masks, dropped entries set to 0, regrown ones given fresh
  optimizer state. (The optimizer's guarded update is `maskfit.step.update`.)
- `runner`: `RuleRunner`, running the rules where they belong (before the
  forward pass, after the update, outside the step before a call).

They import `maskfit.step.mask_state` and, below `step`, `internals`,
`optim`, `spec` and `paths`; nothing else of `step` imports them but
`masker`.
"""
