"""How important each unit is, and which units stay.

- `importance`: `Importance`, `MagnitudeImportance`, `TaylorImportance`: the
  scores of a unit's entries, summed over its whole group;
- `activation`: `ActivationImportance`: scores from the activations seen on
  calibration batches;
- `choice`: scores per atom, kept counts per group (global or per group,
  rounded, with a minimum), and the keep masks per variable.

May import `maskfit.spec` and `maskfit.internals`; never `graph/`, `hub/`
nor the entry points of `maskfit.structured` (it reads a graph's groups
through the objects it is given).
"""
