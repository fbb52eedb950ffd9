"""`DependencyGraph`: which entries of a model go together when a unit is removed.

A *unit* is an output unit of a layer (a Dense unit, a conv filter, an
attention head, an LSTM unit). Each layer that makes units gets a *space* of
unit nodes; tensors carry, along one axis, the unit node of each position
(`TensorUnits`). Walking the model's graph, each layer's `Coupling`
(`maskfit.kinds.couplings`) records which entries of which variables
belong to which unit nodes (its own weights, its consumers' input slices,
per-channel parameters), joins nodes that must go together (a residual add
joins its inputs' channels position by position), and *fixes* nodes that
cannot be removed, with the reason (a model output, a Lambda). The joined
nodes form *atoms*, removed all or none; atoms whose spaces are joined form
a `UnitGroup`, the scope in which a fraction of units is counted and ranked.
"""

import collections
from typing import NamedTuple

import numpy as np

from maskfit.kinds.couplings.calls import CallUnits
from maskfit.kinds.couplings.lookup import coupling_of
from maskfit.structured.graph import keras_graph
from maskfit.structured.graph import nodes as unit_nodes
from maskfit.structured.graph.nodes import (
    Space,  # noqa: F401 (re-exported)
    TensorUnits,
)

__all__ = ["DependencyGraph", "Space", "TensorUnits", "UnitGroup"]


class UnitGroup(NamedTuple):
    """Units that are counted and ranked together: spaces joined by couplings.

    Attributes:
      index: the group's position in `DependencyGraph.groups`.
      spaces: the `Space`s in it (e.g. the filters of two convolutions
        joined by a residual add).
      atoms: indices of its removable atoms (in `DependencyGraph` order).
      channels: per atom, how many units of one space it holds (1, or a
        GroupNormalization group's channels).
      kind: "units" or "heads" (`round_to` does not apply to heads).
      avoid: numbers of kept atoms the choice steps over (a layer of the
        group would compute wrongly with that many channels: `avoid`).

    Example:

    >>> import keras, maskfit.pruning as pruning
    >>> inputs = keras.Input((4,))
    >>> a = keras.layers.Dense(8, name="a")(inputs)
    >>> b = keras.layers.Dense(8, name="b")(inputs)
    >>> joined = keras.layers.Add()([a, b])  # unit u of a goes with unit u of b
    >>> model = keras.Model(inputs, keras.layers.Dense(2, name="head")(joined))
    >>> group, = pruning.DependencyGraph(model).groups
    >>> group
    UnitGroup(0, layers=['a', 'b'], atoms=8, channels=8)
    >>> group.layers, group.kind, len(group.atoms)
    (('a', 'b'), 'units', 8)
    """

    index: int
    spaces: tuple
    atoms: np.ndarray
    channels: np.ndarray
    kind: str
    avoid: tuple = ()

    @property
    def layers(self):
        """Names of the layers whose units are in the group."""
        return tuple(dict.fromkeys(s.layer.name for s in self.spaces))

    def __repr__(self):
        return (
            f"UnitGroup({self.index}, layers={list(self.layers)},"
            f" atoms={len(self.atoms)}, channels={int(self.channels.sum())})"
        )


class DependencyGraph(unit_nodes.UnitNodes):
    """The units of a functional or Sequential model and what each one takes along.

    Torch-Pruning's `DependencyGraph`, for Keras 3, read from the model's
    layer graph (no tracing). Each layer kind's coupling is one object
    (`maskfit.kinds.couplings`); what no coupling can prove safe (a
    Lambda, a custom layer without a declaration, a LayerNormalization over
    the units) makes the units it touches unremovable, and `explain` says
    which layer and why. The model's outputs keep their shape: their units,
    and everything joined to them, stay.

    Args:
      model: a functional or built Sequential `keras.Model` (a `MaskedModel`
        too); nested functional and Sequential models are walked.
      ignored_layers: layers (or names) whose own units are never removed;
        their inputs may still shrink with the units they read.

    Raises:
      ValueError: for a subclassed model, or an unbuilt one.

    Example:

    >>> import keras, maskfit.pruning as pruning
    >>> inputs = keras.Input((8,))
    >>> hidden = keras.layers.Dense(16, name="hidden")(inputs)
    >>> model = keras.Model(inputs, keras.layers.Dense(2, name="head")(hidden))
    >>> graph = pruning.DependencyGraph(model)
    >>> [group.layers for group in graph.groups]
    [('hidden',)]
    """

    def __init__(self, model, ignored_layers=()):
        if not keras_graph.is_graph_model(model) or not model.built:
            keras_graph.graph_of(model)  # raises the error that says why
        super().__init__(_layer_ids(model, ignored_layers))
        self.model = model
        outputs = self._walk(model, None)
        for i, units in enumerate(outputs):
            self.fix(
                units.ids,
                f"output {i} of model '{model.name}': the model's outputs keep"
                " their shape",
            )
        self._finish()

    # ------------------------------------------------------------- walking

    def _walk(self, model, inputs):
        """Walks `model`'s graph from `inputs` (TensorUnits per input); its outputs' units."""
        tensors, calls, outputs = keras_graph.graph_of(model)
        units = {}
        for i, tensor in enumerate(tensors):
            units[id(tensor)] = (
                inputs[i]
                if inputs is not None
                else TensorUnits.none(f"input '{tensor.name}' of model '{model.name}'")
            )
        for call in calls:
            layer = call.layer
            self._layers[id(layer)] = layer
            reads = [units[id(t)] for t in call.inputs]
            if keras_graph.is_graph_model(layer):
                first = keras_graph.flatten(keras_graph.first_argument(call))
                made = self._walk(layer, [units[id(t)] for t in first])
                for tensor in call.inputs:
                    if not any(tensor is t for t in first):
                        self.fix(
                            units[id(tensor)].ids,
                            f"passed to nested model '{layer.name}' besides its inputs",
                        )
            else:
                made = coupling_of(layer).couple(CallUnits(call, units, reads), self)
            if len(made) != len(call.outputs):
                raise ValueError(
                    f"The coupling of layer '{layer.name}' gave {len(made)} outputs"
                    f" for its {len(call.outputs)}; this is a bug in it."
                )
            for tensor, result in zip(call.outputs, made):
                _check_width(layer, tensor, result)
                units[id(tensor)] = result
            self.calls.append((call, {id(t): units[id(t)] for t in call.inputs}, made))
        return [units[id(t)] for t in outputs]

    # ----------------------------------------------------------- finishing

    def _finish(self):
        """Atoms and groups; counts to avoid, per group (fixing what cannot be avoided)."""
        self._group()
        while self._avoid_counts():
            self._group()  # some units were fixed: the atoms changed

    def _avoid_counts(self):
        """Turns `avoided` positions into kept-atom counts of their group.

        Positions whose kept count is not one group's count (they hold part
        of a group, or atoms of several) are fixed instead. Returns True if
        any were.
        """
        counts = collections.defaultdict(set)
        fixed = False
        for _layer, ids, count, reason in self.avoided:
            atoms = self.atoms_of(ids)
            removable = atoms[atoms >= 0]
            if not removable.size:
                continue
            numbers = set(self.group_of_atom[removable].tolist())
            group = self.groups[numbers.pop()] if len(numbers) == 1 else None
            each = None
            if group is not None:
                each = set(
                    np.bincount(removable, minlength=self.num_atoms)[
                        group.atoms
                    ].tolist()
                )
            if group is None or len(each) != 1 or 0 in each:
                self.fix(
                    ids,
                    f"{reason}, and how many of its channels stay is not one group's"
                    " count, so that number could not be avoided",
                )
                fixed = True
                continue
            kept, rest = divmod(count - int(np.sum(atoms < 0)), each.pop())
            if rest == 0 and 0 < kept < len(group.atoms):
                counts[group.index].add(kept)
        self.groups = tuple(
            g._replace(avoid=tuple(sorted(counts.get(g.index, ()))))
            for g in self.groups
        )
        return fixed

    def avoided_counts(self, kept):
        """Lines naming each layer that `kept` (a bool per atom) leaves with a count it
        must avoid (`UnitNodes.avoid`); empty if none."""
        return [
            f"layer '{layer.name}' would keep {count} channels: {reason}"
            for layer, ids, count, reason in self.avoided
            if int(np.sum(self.kept_positions(ids, kept))) == count
        ]

    def _group(self):
        count = len(self._parent)
        roots = np.array([self._find(n) for n in range(count)], np.int64)
        removable = np.array([not self._reasons.get(r) for r in roots.tolist()], bool)
        self._roots = roots
        # Spaces joined through any node form a group.
        space_parent = list(range(len(self.spaces)))

        def find(s):
            while space_parent[s] != s:
                space_parent[s] = space_parent[space_parent[s]]
                s = space_parent[s]
            return s

        space_of = np.asarray(self._space_of, np.int64)
        for node in range(count):
            a, b = find(space_of[node]), find(space_of[roots[node]])
            if a != b:
                space_parent[b] = a
        atom_roots = sorted({int(r) for r in roots[removable].tolist()})
        atom_index = {r: i for i, r in enumerate(atom_roots)}
        self.atom_of_node = np.array(
            [atom_index.get(int(r), -1) for r in roots.tolist()], np.int64
        )
        self.num_atoms = len(atom_roots)
        by_group = collections.defaultdict(list)
        for atom, root in enumerate(atom_roots):
            by_group[find(space_of[root])].append(atom)
        groups = []
        for key in sorted(by_group, key=lambda k: self.spaces[k].first):
            atoms = np.asarray(by_group[key], np.int64)
            members = [s for s in range(len(self.spaces)) if find(s) == key]
            channels = np.zeros(len(atoms), np.int64)
            position = {int(a): i for i, a in enumerate(atoms)}
            for s in members:
                space = self.spaces[s]
                per_atom = np.bincount(
                    [position[int(a)] for a in self.atom_of_node[space.ids] if a >= 0],
                    minlength=len(atoms),
                )
                channels = np.maximum(channels, per_atom)
            kinds = {self.spaces[s].kind for s in members}
            groups.append(
                UnitGroup(
                    len(groups),
                    tuple(self.spaces[s] for s in members),
                    atoms,
                    channels,
                    "heads" if kinds == {"heads"} else "units",
                )
            )
        self.groups = tuple(groups)
        self.group_of_atom = np.zeros(self.num_atoms, np.int64)
        for group in groups:
            self.group_of_atom[group.atoms] = group.index

    # ------------------------------------------------------------- reading

    def atoms_of(self, ids):
        """The atom of each node in `ids` (-1 for a fixed node or no unit)."""
        ids = np.asarray(ids, np.int64)
        return np.where(ids >= 0, self.atom_of_node[np.maximum(ids, 0)], -1)

    def sliced_variables(self, trainable=None):
        """`Slices` of every variable with a removable entry (trainable ones only if asked)."""
        found = []
        for entry in self._slices.values():
            if trainable is not None and bool(entry.variable.trainable) != trainable:
                continue
            if any(np.any(self.atoms_of(ids) >= 0) for ids in entry.axes.values()):
                found.append(entry)
        return found

    def slices_of(self, variable):
        """The `Slices` of `variable`, or None."""
        return self._slices.get(id(variable))

    def kept_positions(self, ids, kept_atoms):
        """Which positions of `ids` stay, given a bool per atom (`kept_atoms`)."""
        atoms = self.atoms_of(ids)
        extended = np.append(np.asarray(kept_atoms, bool), True)
        return extended[np.where(atoms >= 0, atoms, len(extended) - 1)]

    def reasons_of(self, ids):
        """The distinct reasons why nodes among `ids` are fixed, with counts."""
        counts = collections.Counter()
        for node in np.asarray(ids, np.int64).tolist():
            if node >= 0:
                for reason in self._reasons.get(int(self._roots[node]), ()):
                    counts[reason] += 1
        return counts

    def explain(self, layer=None):
        """Says, per layer, which of its units can be removed, and why not.

        Args:
          layer: a layer of the model, or its name; None explains every layer.

        Returns:
          The explanation, one block of lines per layer.
        """
        from maskfit.structured.graph import explain as explain_lib

        return explain_lib.explain(self, layer)


def _check_width(layer, tensor, units):
    if units.ids is None:
        return
    shape = tuple(tensor.shape)
    if not -len(shape) <= units.axis < 0 or shape[units.axis] != len(units.ids):
        raise ValueError(
            f"The coupling of layer '{layer.name}' says its output (shape {shape})"
            f" carries {len(units.ids)} units along axis {units.axis}; this is a"
            f" bug in the coupling of {type(layer).__name__}."
        )


def _layer_ids(model, layers):
    from maskfit import internals

    by_name = {l.name: l for l in internals.sublayers(model)}
    found = set()
    for item in layers or ():
        if isinstance(item, str):
            if item not in by_name:
                raise ValueError(
                    f"ignored_layers names '{item}', which is no layer of model"
                    f" '{model.name}'. Its layers: {sorted(by_name)[:20]}"
                )
            item = by_name[item]
        found.add(id(item))
    return found
