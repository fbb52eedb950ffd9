"""Which entries of a layer's variables belong to which of its output units.

- `declaration`: `OutputUnits`, `units_along`, `SHARED`, `refusal`: how a
  layer declares its units.
- `lookup`: which declaration applies to a layer (registered, its own
  method, or the built-in record of its class, `maskfit.kinds`),
  `register_output_units`.
- `keras_layers`: `keras.layers` with stand-ins for classes newer than the
  oldest supported Keras (the records of `maskfit.kinds` are keyed by it).
- `layout`: a declaration checked and turned into per-variable `UnitLayout`s,
  cached on the layer.
- `probe`: the self-check of a declaration against the layer's gradients.

It imports `internals`, `checks` and `kinds` (`kinds.record`, the lookup
order; the records name this package's declarations).
"""
