"""Which entries of a layer's variables belong to which of its output units.

- `declaration`: `OutputUnits`, `units_along`, `SHARED`, `refusal`: how a
  layer declares its units.
- `lookup`: which declaration applies to a layer (registered, its own
  method, or built in), `register_output_units`.
- `keras_tables`, `keras_recurrent`, `keras_layers`: the declarations of
  every built-in Keras layer (or the reason it is refused).
- `layout`: a declaration checked and turned into per-variable `UnitLayout`s,
  cached on the layer.
- `probe`: the self-check of a declaration against the layer's gradients.
"""
