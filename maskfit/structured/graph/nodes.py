"""The unit nodes of a dependency graph, as couplings record them.

`UnitNodes` is the part of `DependencyGraph` that a `Coupling` writes to:
spaces of unit nodes (`new_space`), which entries of which variables belong
to which nodes (`slice`), nodes that go together (`join`) and nodes that must
stay, with the reason (`fix`, `refuse`), and channel counts a layer must
not be left with (`avoid`). A coupling's `TensorUnits` (`maskfit.kinds.couplings.calls`) say
which node each position of a tensor's unit axis carries.
"""

import collections
from typing import NamedTuple

import numpy as np

from maskfit.kinds.couplings.calls import TensorUnits
from maskfit.kinds.couplings.signature import Memo

__all__ = ["Slices", "Space", "UnitNodes"]


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


class Slices(NamedTuple):
    """The entries of one variable that belong to unit nodes, axis by axis."""

    variable: object
    layer: object
    axes: dict  # axis (>= 0) -> ids per position along it
    scored: dict  # axis -> whether importance counts these entries
    state: bool  # a statistic (BN moving mean), not a parameter


class UnitNodes:
    """Unit nodes in a union-find, with the reasons some must stay.

    Attributes:
      spaces: every `Space` made, in order.
      calls: `(call, {id(input): TensorUnits}, [output TensorUnits])` per
        layer call walked.
      avoided: `(layer, ids, count, reason)` per `avoid`.
      memo: the outcomes of the gradient checks run while building, by the
        signature of what was checked (`maskfit.kinds.couplings.signature`):
        identical blocks are checked once.
    """

    def __init__(self, ignored=frozenset()):
        self._parent = []
        self._space_of = []
        self._reasons = collections.defaultdict(list)
        self.spaces = []
        self._own = {}  # (id(layer), name) -> Space
        self._slices = {}  # id(variable) -> Slices
        self._notes = collections.defaultdict(dict)
        self._said = collections.defaultdict(list)  # id(layer) -> statements
        self._layers = {}
        self._ignored = ignored
        self.calls = []
        self.avoided = []
        self.memo = Memo()

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

    def ignores(self, layer):
        """Whether `layer` is in `ignored_layers` (its units stay)."""
        return id(layer) in self._ignored

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

    def avoid(self, layer, ids, count, reason):
        """Records that exactly `count` of the positions `ids` must not stay.

        For a layer that computes wrongly with that many channels (Keras adds
        a channels_first bias along the wrong axis when the channels equal
        the output's last dimension): the choice of units steps over that
        count, and `shrink` refuses a selection that has it.
        """
        self.avoided.append((layer, np.asarray(ids, np.int64), int(count), reason))

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
        return [TensorUnits.none(f"output of '{layer.name}', which {reason}")] * outputs

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
