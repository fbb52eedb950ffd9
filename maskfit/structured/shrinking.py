"""`shrink`: a smaller stock Keras model without the removed units."""

import copy
import warnings

import keras
import numpy as np

from maskfit import support
from maskfit.kinds.couplings.lookup import coupling_of
from maskfit.spec import rules as rules_lib
from maskfit.structured import prune as prune_units_lib
from maskfit.structured import rule as unit_rule
from maskfit.structured.derive import coupling as derive_coupling
from maskfit.structured.derive import resize as derive_resize
from maskfit.structured.graph import dependency as unit_graph
from maskfit.structured.graph import keras_graph
from maskfit.structured.hub import couplings as couplings_hub
from maskfit.structured.hub import shrink as hub_shrink
from maskfit.structured.hub import stock as hub_stock

__all__ = ["shrink"]


class _Shrunk:
    """What stays, as `Coupling.shrink_config` reads it."""

    def __init__(self, graph, kept):
        self.graph, self._kept = graph, np.asarray(kept, bool)

    def kept(self, ids):
        return self.graph.kept_positions(ids, self._kept)

    def cut(self, variable):
        """`variable`'s value (numpy) with the removed units' entries left out."""
        value = np.asarray(keras.ops.convert_to_numpy(variable))
        entry = self.graph.slices_of(variable)
        if entry is not None:
            for axis, ids in entry.axes.items():
                value = np.compress(self.kept(ids), value, axis=axis)
        return value

    def zeroed(self, variable):
        """`variable`'s value (numpy) with the removed units' entries set to 0."""
        value = np.array(keras.ops.convert_to_numpy(variable))
        entry = self.graph.slices_of(variable)
        if entry is not None:
            for axis, ids in entry.axes.items():
                index = [slice(None)] * value.ndim
                index[axis] = ~self.kept(ids)
                value[tuple(index)] = 0
        return value

    def fit(self, variable, shape):
        """`variable`'s value (numpy) with the removed units' entries cut along the
        axes `shape` shortens and set to 0 along the others."""
        value = self.zeroed(variable)
        entry = self.graph.slices_of(variable)
        if entry is not None:
            for axis, ids in entry.axes.items():
                if shape[axis] != value.shape[axis]:
                    value = np.compress(self.kept(ids), value, axis=axis)
        return value

    def count(self, layer, name="units"):
        space = self.graph.own_space(layer, name)
        if space is None:
            raise ValueError(
                f"Layer '{layer.name}' made no {name} in the dependency graph; this"
                " is a bug in its coupling's shrink_config."
            )
        return int(np.sum(self.kept(space.ids)))

    def note(self, layer, key):
        return self.graph.note(layer, key)

    def copy(self, old, new, where, advice):
        """Assigns the `old` weights, cut to the kept units, to the `new` ones.

        Args:
          old, new: the pruned model's weights and their smaller copies, in order.
          where: what is copied, to begin each error ("shrink: layer 'dense'").
          advice: what the error says to do.

        Raises:
          ValueError: when the counts or a cut weight's shape do not match.
        """
        if len(old) != len(new):
            raise ValueError(
                f"{where} has {len(old)} weights but its smaller copy {len(new)};"
                f" {advice}"
            )
        for source, target in zip(old, new):
            value = self.cut(source)
            if value.shape != tuple(target.shape):
                raise ValueError(
                    f"{where}: '{source.path}' cut to shape {value.shape} does not"
                    f" fit '{target.path}' of shape {tuple(target.shape)}; {advice}"
                )
            target.assign(value)


def shrink(model, selection=None, uniform=False):
    """Returns a stock Keras model without the removed units, its outputs unchanged.

    Every layer keeps its name and class, with fewer units, filters or heads
    where units were removed; every weight (BatchNormalization's moving
    statistics too) keeps the entries of the units that stay. The outputs
    equal the pruned model's (where removed entries are 0) up to float
    rounding, on any input. A `MaskedModel` gives a `keras.Model`, a
    `MaskedSequential` a `keras.Sequential`: nothing of maskfit is in it, so
    it saves and loads with stock Keras, `safe_mode=True`.

    Args:
      model: a functional or built Sequential model.
      selection: a `UnitSelection` (from `select_units`, or
        `UnitSelection.removing`); by default, the units that `prune_units`
        has removed from `model` so far.
      uniform: for a keras_hub backbone whose transformer blocks all keep
        the same numbers of heads and FFN units: return the backbone's own
        keras_hub class with a smaller config (`intermediate_dim`,
        `num_heads`, `num_query_heads`, `num_key_value_heads`), which
        `from_config` rebuilds. A model pruned with `prune_units` remembers
        the backbone it was made from. Otherwise a functional `keras.Model`
        of the same layers, each with its own smaller config.

    Returns:
      The smaller model (`size_report(model, shrunk)` compares the two).

    Raises:
      ValueError: for a subclassed model, a selection made for another model,
        or `uniform=True` where the blocks keep different counts.

    Example:

    >>> import keras, numpy as np, maskfit.pruning as pruning
    >>> inputs = keras.Input((4,))
    >>> hidden = keras.layers.Dense(8, name="hidden")(inputs)
    >>> model = keras.Model(inputs, keras.layers.Dense(2, name="head")(hidden))
    >>> small = pruning.shrink(model, pruning.select_units(model, 0.5))
    >>> small.get_layer("hidden").units
    4
    """
    support.require("structured_oneshot", "shrink")
    prune_units_lib._check_model(model, "shrink")
    if selection is None:
        if isinstance(rules_lib.get_rule(model), unit_rule.UnitPruning):
            selection = prune_units_lib.unit_selection(model)
        else:
            graph = unit_graph.DependencyGraph(model)
            selection = prune_units_lib.UnitSelection(
                graph, np.ones(graph.num_atoms, bool)
            )
    if selection.graph.model is not model:
        raise ValueError(
            f"shrink: the selection was made for model '{selection.graph.model.name}',"
            f" not for '{model.name}'. Select the units of the model you shrink."
        )
    problems = selection.graph.avoided_counts(selection.kept)
    if problems:
        raise ValueError(
            f"shrink: {problems[0]}. Choose one unit more or fewer for that layer."
        )
    shrunk = _Shrunk(selection.graph, selection.kept)
    if uniform:
        return hub_shrink.same_class(prune_units_lib.origin_of(model), shrunk)
    pairs = []
    small = _rebuild(model, None, shrunk, pairs, {})
    for old, new in pairs:
        _copy_weights(old, new, shrunk)
    return small


def _new_layer(layer, shrunk):
    """`layer` rebuilt from its config with fewer units (or a refusal naming it)."""
    if not isinstance(layer, keras.layers.Layer):
        return _new_operation(layer, shrunk)
    try:
        config = copy.deepcopy(hub_shrink.config_of(layer))
    except Exception as error:  # noqa: BLE001 - one refusal, naming the layer
        raise hub_shrink.refusal(layer, "get_config()", error) from error
    coupling = coupling_of(layer)
    try:
        if isinstance(coupling, couplings_hub.HubBlock):
            new = coupling.rebuild(layer, _unbuilt(config), shrunk)
            return hub_stock.StockBlock(layer, shrunk, coupling) if new is None else new
        if isinstance(coupling, derive_coupling.Derived):
            found = derive_resize.resized(layer, _unbuilt(config), shrunk)
            if found.partial:
                _warn_same_size(layer, shrunk, found, partial=True)
            if found.layer is not None:
                return found.layer
            # Its units are its own (its input and output stay): the same
            # config, its removed units' entries 0 (`_copy_weights`).
            _warn_same_size(layer, shrunk, found)
            return type(layer).from_config(_unbuilt(config))
        config = _unbuilt(coupling.shrink_config(layer, config, shrunk))
        return type(layer).from_config(config)
    except Exception as error:  # noqa: BLE001
        raise hub_shrink.refusal(layer, "from_config()", error) from error


def _new_operation(operation, shrunk):
    """A keras.ops call's operation, rebuilt from its config as its coupling cuts it.

    An operation without a config (Keras raises for some) holds no state and
    no coupling of it changes a config: the same one is called again.
    """
    try:
        config = copy.deepcopy(operation.get_config())
    except Exception:  # noqa: BLE001 - no config: nothing of it to cut
        return operation
    coupling = coupling_of(operation)
    try:
        return type(operation).from_config(
            coupling.shrink_config(operation, config, shrunk)
        )
    except Exception as error:  # noqa: BLE001
        raise hub_shrink.refusal(operation, "from_config()", error) from error


def _unbuilt(config):
    """`config` without the build shapes of the layers serialized in it.

    A wrapper's config (TimeDistributed, Bidirectional) holds its layer
    serialized with the input shape it was built for, and deserializing
    builds it so: with fewer input channels, it must build anew.
    """
    if isinstance(config, dict):
        return {k: _unbuilt(v) for k, v in config.items() if k != "build_config"}
    if isinstance(config, (list, tuple)):
        return type(config)(_unbuilt(v) for v in config)
    return config


def _map(structure, mapping):
    return keras.tree.map_structure(
        lambda x: mapping[id(x)] if isinstance(x, keras.KerasTensor) else x, structure
    )


def _rebuild(model, new_inputs, shrunk, pairs, made):
    """Builds `model` anew from `new_inputs` (model inputs by default)."""
    tensors, calls, outputs = keras_graph.graph_of(model)
    if new_inputs is None:
        new_inputs = [
            keras.Input(
                batch_shape=t.shape,
                dtype=t.dtype,
                sparse=t.sparse,
                name=keras_graph.input_name(t),
            )
            for t in tensors
        ]
    mapping = {id(t): n for t, n in zip(tensors, new_inputs)}
    for call in calls:
        layer = call.layer
        args, kwargs = _map((call.args, call.kwargs), mapping)
        new = made.get(id(layer))
        if new is None:
            if keras_graph.is_graph_model(layer):
                first = keras_graph.flatten(
                    _map(keras_graph.first_argument(call), mapping)
                )
                inner = [keras.Input(batch_shape=x.shape, dtype=x.dtype) for x in first]
                new = _rebuild(layer, inner, shrunk, pairs, made)
            else:
                new = _new_layer(layer, shrunk)
                stock = isinstance(new, hub_stock.StockBlock)
                if isinstance(layer, keras.layers.Layer) and not stock:
                    pairs.append((layer, new))  # keras.ops calls have no weights
            made[id(layer)] = new
        try:
            result = new(*args, **kwargs)
        except Exception as error:  # noqa: BLE001 - one refusal, naming the layer
            raise hub_shrink.refusal(layer, "call, rebuilt,", error) from error
        if isinstance(new, hub_stock.StockBlock):
            pairs.extend(p for p in new.pairs if p not in pairs)
        for tensor, value in zip(call.outputs, keras.tree.flatten(result)):
            mapping[id(tensor)] = value
    if isinstance(model, keras.Sequential):
        start = keras.Input(batch_shape=new_inputs[0].shape, dtype=new_inputs[0].dtype)
        return keras.Sequential(
            [start] + [made[id(l)] for l in model.layers], name=model.name
        )
    inputs = keras.tree.pack_sequence_as(model.input, new_inputs)
    if isinstance(inputs, list) and len(inputs) == 1:
        inputs = inputs[0]  # called with a tensor, as a list of one it warns
    return keras.Model(
        inputs,
        keras.tree.pack_sequence_as(model.output, [mapping[id(t)] for t in outputs]),
        name=model.name,
    )


def _warn_same_size(layer, shrunk, found, partial=False):
    """Warns that `layer` keeps removed units (`found`: `resize.Resized`), naming them."""
    if all(
        np.all(shrunk.zeroed(v) == keras.ops.convert_to_numpy(v)) for v in layer.weights
    ):
        return
    fields = found.fields
    tried = (
        f"no config field that was tried ({', '.join(fields)}) gave"
        if fields
        else "no integer field of its config holds a count of"
    )
    what = "keeps part of its size" if partial else "keeps its size"
    why = f" In it, {found.why}." if found.why else ""
    warnings.warn(
        f"shrink: layer '{layer.name}' ({type(layer).__name__}) {what}: its"
        " units come from a coupling derived from its computation, and"
        f" {tried} weights of the cut shapes and the masked layer's outputs.{why}"
        " Its removed units' entries that stay are 0, so the outputs equal the"
        " masked model's. To shrink it, declare its coupling"
        " (maskfit.pruning.register_coupling) with a shrink_config.",
        stacklevel=4,
    )


def _copy_weights(old, new, shrunk):
    if isinstance(coupling_of(old), derive_coupling.Derived):
        # Cut along the axes its config shortened (`resize`), 0 along the others.
        if len(old.weights) != len(new.weights):
            raise ValueError(
                f"shrink: layer '{old.name}' has {len(old.weights)} weights but its"
                f" smaller copy {len(new.weights)}; this is a bug in maskfit's"
                " resize of derived couplings."
            )
        for source, target in zip(old.weights, new.weights):
            target.assign(shrunk.fit(source, tuple(target.shape)))
        return
    shrunk.copy(
        old.weights,
        new.weights,
        f"shrink: layer '{old.name}'",
        f"this is a bug in the coupling of {type(old).__name__}.",
    )
