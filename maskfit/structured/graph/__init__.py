"""The dependency graph: which entries of a model go together when a unit is removed.

- `keras_graph`: a functional or Sequential model's layer calls, with their
  arguments bound (read through `maskfit.internals.graphs`);
- `nodes`: the unit nodes (a union-find of spaces and the variable slices
  that belong to them, with the reasons some must stay);
- `dependency`: `DependencyGraph`, built by asking each call's `Coupling`
  (`maskfit.kinds.couplings.lookup.coupling_of`) what it makes, reads and
  passes on;
- `explain`: per layer, which units can go and why the others stay.

May import `maskfit.kinds`, `maskfit.records`, `maskfit.units` and
`maskfit.internals`; never the other sub-packages of `maskfit.structured`
(`hub/`, `scoring/`) nor its entry points.
"""
