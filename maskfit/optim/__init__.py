"""What maskfit needs to know about, and do to, Keras optimizers.

- `traits`: what an optimizer does to an entry whose gradient is 0 (which
  need a restore; which keep a dropped entry at 0 by themselves).
- `rebuild`: building an optimizer in place for another variable set,
  keeping the state of the variables it keeps.
- `rates`: `scaled_learning_rates`, an optimizer stepping chosen variables at
  its learning rate times a multiplier.
- `rate_modes`: how each Keras optimizer class takes that multiplier.
"""
