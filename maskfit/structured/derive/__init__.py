"""Couplings derived by tracing a layer's computation (`coupling_of`'s last fallback).

- `trace`: the layer's stateless call as a jaxpr;
- `propagate`: unit labels through its equations (joins, and the operations
  that stop them);
- `axes`: the labels through the operations that move axes (reshapes into
  heads, transposes, broadcasts, slices, splits);
- `spaces`: the unit spaces read off the labels;
- `coupling`: `Derived`, the coupling built from them and gradient-checked;
- `resize`: the smaller config `shrink` gives such a layer, found by search
  and checked (shapes, then outputs).

May import `maskfit.kinds`, `maskfit.internals` and `maskfit.structured.hub`
(its gradient check); never `graph/`, `scoring/` nor the entry points.
"""
