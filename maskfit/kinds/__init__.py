"""maskfit.kinds: everything maskfit knows about each built-in Keras layer class.

One `LayerKind` record per class (its output units, the variables magnitude
pruning prunes, how units cross it, its units from the config), written in
the module of its family and installed once when maskfit is imported:

- `record`: `LayerKind`, and `Lookup`, the one order in which units,
  pruning and structured pruning look a layer up (registered, the layer's
  own method, the built-in record, refusal). It imports no family module,
  so the packages below can read the records.
- `dense`, `conv`, `normalization`, `elementwise`, `reshaping`,
  `recurrent`, `attention`, `refused`: the records, by layer family.
- `common`: what several families' unit declarations share.
- `builtin`: every family's records, each class once, installed.
"""
