"""keras_hub's transformer blocks, as structured pruning reads and rebuilds them.

- `couplings`: the couplings of keras_hub's decoder and encoder blocks
  (heads, by key/value group under grouped-query attention, and FFN units,
  by the sublayers they call), added to `coupling_of` as a fallback;
- `check`: their gradient check (a removed unit is cut off);
- `twins`: classes that compute as another class and can write a head size;
- `shrink`: `shrink(..., uniform=True)`: the same backbone class with a
  smaller config;
- `stock`: blocks written out as stock Keras layers where their class
  cannot say the result.

May import `maskfit.kinds` and `maskfit.internals` (and keras_hub, only when
a model holds its layers); never `graph/`, `scoring/` nor the entry points of
`maskfit.structured`.
"""
