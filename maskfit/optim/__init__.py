"""What maskfit needs to know about, and do to, Keras optimizers.

- `traits`: what an optimizer does to an entry whose gradient is 0 (which
  need a restore; which keep a dropped entry at 0 by themselves).
- `rebuild`: building an optimizer in place for another variable set,
  keeping the state of the variables it keeps.
- `rates`: `scaled_learning_rates`, an optimizer stepping chosen variables at
  its learning rate times a multiplier.
- `stateless_rates`: `scaled`, the same around `optimizer.stateless_apply`,
  in `keras.ops`.
- `hooks`: `MultiplierHooks`, the hooks on one optimizer that both put in
  (its `update_step`, weight decay and learning rate at learning rate x m).
- `rate_modes`: how each Keras optimizer class takes that multiplier.

It imports `internals`, `checks` and `paths` only: what an optimizer is and
does, not how a step uses it (`maskfit.step` imports it).
"""
