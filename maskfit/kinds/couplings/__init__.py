"""What every layer family's coupling is made of: how units cross one layer call.

A coupling says, for one call of a layer in a model's graph, which entries of
its variables belong to which unit nodes and which units pass to its outputs
(`maskfit.structured` builds its dependency graph from them). The coupling
classes of Keras's layers are written in the family modules of
`maskfit.kinds`, beside the records that name them; this package holds what
they share:

- `calls`: what a coupling reads and returns (`Call`, `CallUnits`,
  `TensorUnits`);
- `arguments`: a call's arguments as plain data, to call the layer again the
  same way (its other tensors as zeros);
- `base`: `Coupling`, `Refused`, and `UnitCoupling` for users' layers;
- `producer`: `Producer`, the coupling of the layers that make units (dense
  and convolution families);
- `parts`: reading a layer's input units, making its own, checking them;
- `channel_map`: where a layer that moves positions sends each channel;
- `check`: a declared coupling's self-check against the layer's gradients;
- `signature`: which calls compute the same thing, so each check runs once
  per signature in a graph build (`Memo`);
- `lookup`: `coupling_of` and `register_coupling`, in maskfit's one lookup
  order (`maskfit.records.Lookup`).

May import `maskfit.records`, `maskfit.units` and `maskfit.internals`; never
the family modules of `maskfit.kinds` nor `maskfit.structured`.
"""
