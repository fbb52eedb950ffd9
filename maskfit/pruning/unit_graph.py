"""`DependencyGraph`: which entries of a model go together when a unit is removed.

A *unit* is an output unit of a layer (a Dense unit, a conv filter, an
attention head, an LSTM unit). Each layer that makes units gets a *space* of
unit nodes; tensors carry, along one axis, the unit node of each position
(`TensorUnits`). Walking the model's graph, each layer's `Coupling`
(`maskfit.pruning.couplings`) records which entries of which variables
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

from maskfit.pruning import couplings as couplings_lib
from maskfit.pruning import keras_graph

__all__ = ["DependencyGraph", "Space", "TensorUnits", "UnitGroup"]


class TensorUnits(NamedTuple):
    """The units a tensor carries: `ids[p]` is the unit node at position `p` of `axis`.

    `axis` is negative (counted from the end, so it holds under wrappers
    that add leading axes); None when the tensor carries no unit. `ids` has
    -1 where a position is no unit; `reason` says why (a model input, the
    output of a layer maskfit cannot see into).
    """

    axis: object
    ids: object
    reason: str = ""

    @staticmethod
    def none(reason):
        return TensorUnits(None, None, reason)

    @property
    def width(self):
        return 0 if self.ids is None else len(self.ids)

    def has_units(self):
        return self.ids is not None and bool(np.any(self.ids >= 0))


class Space(NamedTuple):
    """The units one layer makes: nodes `first .. first + size - 1`."""

    layer: object
    name: str
    first: int
    size: int
    kind: str  # "units" (channels, filters) or "heads"

    @property
    def ids(self):
        return np.arange(self.first, self.first + self.size, dtype=np.int64)


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
    """

    index: int
    spaces: tuple
    atoms: np.ndarray
    channels: np.ndarray
    kind: str

    @property
    def layers(self):
        """Names of the layers whose units are in the group."""
        return tuple(dict.fromkeys(s.layer.name for s in self.spaces))

    def __repr__(self):
        return (
            f"UnitGroup({self.index}, layers={list(self.layers)},"
            f" atoms={len(self.atoms)}, channels={int(self.channels.sum())})"
        )


class Slices(NamedTuple):
    """The entries of one variable that belong to unit nodes, axis by axis."""

    variable: object
    layer: object
    axes: dict  # axis (>= 0) -> ids per position along it
    scored: dict  # axis -> whether importance counts these entries
    state: bool  # a statistic (BN moving mean), not a parameter


class DependencyGraph:
    """The units of a functional or Sequential model and what each one takes along.

    Torch-Pruning's `DependencyGraph`, for Keras 3, read from the model's
    layer graph (no tracing). Each layer kind's coupling is one object
    (`maskfit.pruning.couplings`); what no coupling can prove safe (a
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
        self.model = model
        self._parent = []
        self._space_of = []
        self._reasons = collections.defaultdict(list)
        self.spaces = []
        self._own = {}  # (id(layer), name) -> Space
        self._slices = {}  # id(variable) -> Slices
        self._notes = collections.defaultdict(dict)
        self._said = collections.defaultdict(list)  # id(layer) -> statements
        self._layers = {}
        self._ignored = _layer_ids(model, ignored_layers)
        # (call, {id(input tensor): TensorUnits}, [output TensorUnits]) per
        # layer call walked, nested models' calls included.
        self.calls = []
        outputs = self._walk(model, None)
        for i, units in enumerate(outputs):
            self.fix(
                units.ids,
                f"output {i} of model '{model.name}': the model's outputs keep"
                " their shape",
            )
        self._finish()

    # ------------------------------------------------------------ building

    def new_space(self, layer, name, size, kind="units"):
        """The space of `size` units that `layer` makes (the same one on every call)."""
        key = (id(layer), name)
        if key not in self._own:
            space = Space(layer, name, len(self._parent), int(size), kind)
            self._parent.extend(range(space.first, space.first + space.size))
            self._space_of.extend([len(self.spaces)] * space.size)
            self.spaces.append(space)
            self._own[key] = space
            self._layers[id(layer)] = layer
            if id(layer) in self._ignored:
                self.fix(space.ids, f"layer '{layer.name}' is in ignored_layers")
        return self._own[key]

    def _find(self, node):
        parent = self._parent
        root = node
        while parent[root] != root:
            root = parent[root]
        while parent[node] != root:
            parent[node], node = root, parent[node]
        return root

    def join(self, a, b, reason=""):
        """Joins the unit nodes of `a` and `b` position by position.

        Where one side is -1 (no unit), the other side's node is fixed with
        `reason`.
        """
        a, b = np.asarray(a, np.int64), np.asarray(b, np.int64)
        for x, y in zip(a.tolist(), b.tolist()):
            if x < 0 and y < 0:
                continue
            if x < 0 or y < 0:
                self.fix([max(x, y)], reason)
                continue
            rx, ry = self._find(x), self._find(y)
            if rx != ry:
                self._parent[ry] = rx
                if ry in self._reasons:
                    self._reasons[rx].extend(self._reasons.pop(ry))

    def fix(self, ids, reason):
        """Makes the unit nodes `ids` (and all joined to them) unremovable, for `reason`."""
        if ids is None:
            return
        for node in set(np.asarray(ids, np.int64).reshape(-1).tolist()):
            if node >= 0:
                reasons = self._reasons[self._find(node)]
                if reason not in reasons:
                    reasons.append(reason)

    def slice(self, layer, variable, axis, ids, scored=True, state=False):
        """Records that position `p` along `axis` of `variable` belongs to node `ids[p]`.

        A variable sliced twice along one axis (a layer called twice) joins
        the two nodes of each position. A parameter that is not trainable
        cannot be kept at 0 in training: its nodes are fixed.
        """
        ids = np.asarray(ids, np.int64)
        axis = axis % len(variable.shape)
        if variable.shape[axis] != len(ids):
            raise ValueError(
                f"The coupling of layer '{layer.name}' slices axis {axis} of"
                f" '{variable.path}' (shape {tuple(variable.shape)}) with"
                f" {len(ids)} positions. This is a bug in the coupling of"
                f" {type(layer).__name__}."
            )
        entry = self._slices.get(id(variable))
        if entry is None:
            entry = Slices(variable, layer, {}, {}, state)
            self._slices[id(variable)] = entry
        if axis in entry.axes:
            self.join(
                entry.axes[axis],
                ids,
                f"'{variable.path}' reads positions that are units in one call"
                " and not in another",
            )
        else:
            entry.axes[axis] = ids
            entry.scored[axis] = scored
        if not state and not variable.trainable:
            self.fix(
                ids,
                f"'{variable.path}' is not trainable, so its entries of a removed"
                " unit could not be kept at 0 in training",
            )

    def refuse(self, layer, inputs, reason, outputs=1):
        """Fixes every unit `layer` reads, for `reason`; its outputs carry none."""
        self.say(layer, f"refused: {reason}")
        for units in inputs:
            self.fix(units.ids, f"read by layer '{layer.name}', which {reason}")
        return [
            TensorUnits.none(f"output of '{layer.name}', which {reason}")
        ] * outputs

    def note(self, layer, key, value=None):
        """Stores (or, without `value`, returns) what a coupling needs at shrink time."""
        if value is None:
            return self._notes[id(layer)].get(key)
        self._notes[id(layer)][key] = value
        return value

    def say(self, layer, statement):
        """Records a line of `explain` for `layer`."""
        self._layers[id(layer)] = layer
        if statement not in self._said[id(layer)]:
            self._said[id(layer)].append(statement)

    def own_space(self, layer, name="units"):
        """The space `layer` made under `name`, or None."""
        return self._own.get((id(layer), name))

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
                made = couplings_lib.coupling_of(layer).couple(
                    couplings_lib.CallUnits(call, units, reads), self
                )
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
        count = len(self._parent)
        roots = np.array([self._find(n) for n in range(count)], np.int64)
        removable = np.array(
            [not self._reasons.get(r) for r in roots.tolist()], bool
        )
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
        from maskfit.pruning import explain as explain_lib

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
