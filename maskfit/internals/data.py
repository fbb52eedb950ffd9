"""Private members of `fit`'s input, its epoch bookkeeping and tf.data that maskfit reads.

Part of `maskfit.internals`, for the exact backup (`maskfit.backup`): a
callback sees neither `fit`'s input nor how far into it an epoch is, and it
cannot tell `fit` where to start (Keras's own `BackupAndRestore` sets a
private attribute for that). Each accessor names the private member, what it
is for and what public API is missing. Checked on Keras 3.10.0 with TF 2.16.2
and Keras 3.15.1 with TF 2.21.0.
"""

import collections
import importlib
import inspect

import tensorflow as tf

__all__ = [
    "PRIVATE_MEMBERS",
    "DatasetOp",
    "dataset_ops",
    "fit_dataset",
    "fit_input",
    "iterator_kept",
    "learned_epoch_length",
    "restore_epoch_count",
    "set_initial_epoch",
    "symbolic_build",
]

_INPUT_LIB = "tensorflow.python.distribute.input_lib"

# (where, member, what it is for).
PRIVATE_MEMBERS = (
    (
        "keras.Model",
        "_initial_epoch",
        "the epoch `fit` starts at, which it reads just after `on_train_begin`;"
        " Keras's own BackupAndRestore sets it, no public API does.",
    ),
    (
        "keras.Model",
        "_symbolic_build",
        "builds a model, its compiled metrics and loss from an input spec, as"
        " `fit` does under a strategy: a model Keras would build inside its"
        " first step must exist before its backup can be loaded.",
    ),
    (
        "keras.Model.fit",
        "epoch_iterator",
        "`fit`'s local `EpochIterator`, found on the call stack in"
        " `on_train_begin`: its `data_adapter` says what the input is (arrays,"
        " tf.data, PyDataset) and whether it is shuffled; callbacks get no"
        " handle on the input.",
    ),
    (
        "keras.src.trainers.epoch_iterator.EpochIterator",
        "_current_iterator",
        "the data iterator the next epoch continues (with `steps_per_epoch`,"
        " Keras keeps one across epochs until it runs out).",
    ),
    (
        "keras.src.trainers.epoch_iterator.EpochIterator",
        "_num_batches",
        "the batches an epoch has, which Keras learns when an input of unknown"
        " size first runs out; a restarted `fit` must end its epochs where the"
        " interrupted one did (Keras calls the train function once more on an"
        " exhausted input, and that call still moves the weights).",
    ),
    (
        "keras.src.trainers.epoch_iterator.EpochIterator",
        "_steps_seen",
        "the batches read from the current iterator, by which Keras ends an"
        " epoch that runs out of data: a resumed `fit` counts those that earlier"
        " epochs read from an iterator it kept.",
    ),
    (
        "keras.src.backend.tensorflow.trainer.TFEpochIterator",
        "_distributed_dataset",
        "the tf.data pipeline `fit` iterates (Keras builds it from arrays).",
    ),
    (
        "tf.distribute.DistributedDataset",
        "_original_dataset",
        "the dataset a strategy distributes, to read its graph.",
    ),
    (
        "tf.data.Dataset",
        "_inputs",
        "the datasets a dataset reads, to walk a pipeline and find what makes"
        " its order differ from one pass or process to the next.",
    ),
    (
        "tf.data.Dataset",
        "_functions",
        "the functions of a pipeline's map, filter, flat_map...: their ops"
        " (unseeded random ops, Python code, nested shuffles).",
    ),
    (
        "tf.data.Dataset.shuffle()",
        "_reshuffle_each_iteration",
        "whether a shuffle reshuffles on every pass; with `_seed`, `_seed2`"
        " (also of a random dataset, whose `_rerandomize` says the same) and"
        " the `_deterministic` of parallel maps and batches.",
    ),
)


def set_initial_epoch(model, epoch):
    """Makes the running `fit` start at `epoch` (or at its own `initial_epoch` for None)."""
    model._initial_epoch = epoch


def symbolic_build(model, spec):
    """Builds `model`, its compiled metrics and loss from `spec` (a batch's structure)."""
    with model.distribute_strategy.scope():
        model._symbolic_build(data_batch=spec)


def fit_input(model, depth=12):
    """Returns the `EpochIterator` of the `fit` of `model` that is running, or None.

    Called from a callback's `on_train_begin`; looks `depth` frames up.
    """
    frame = inspect.currentframe()
    try:
        for _ in range(depth):
            frame = frame.f_back
            if frame is None:
                return None
            if frame.f_code.co_name != "fit":
                continue
            local = frame.f_locals
            if local.get("self") is model and "epoch_iterator" in local:
                return local["epoch_iterator"]
        return None
    finally:
        del frame


def iterator_kept(epoch_iterator, iterator):
    """Whether the next epoch of `fit` continues `iterator` (not a new pass)."""
    if epoch_iterator is None or epoch_iterator.steps_per_epoch is None:
        return False
    return getattr(epoch_iterator, "_current_iterator", None) is iterator


def learned_epoch_length(epoch_iterator):
    """The batches an epoch of `fit` has, as Keras knows it now (None: unknown yet)."""
    return getattr(epoch_iterator, "_num_batches", None)


def restore_epoch_count(epoch_iterator, epoch_length=None, batches=0):
    """Puts `fit`'s count of an epoch's batches back as it was.

    Args:
      epoch_iterator: `fit`'s `EpochIterator` (nothing happens for None).
      epoch_length: the epoch length the interrupted run had learned (set
        only where this one has not learned one).
      batches: batches that earlier epochs read from the current iterator.
    """
    if epoch_iterator is None:
        return
    if epoch_length is not None and epoch_iterator._num_batches is None:
        epoch_iterator._num_batches = epoch_length
    epoch_iterator._steps_seen += batches


def fit_dataset(epoch_iterator):
    """The `tf.data.Dataset` that `fit` iterates, or None when it cannot be read."""
    dataset = getattr(epoch_iterator, "_distributed_dataset", None)
    if dataset is not None and not isinstance(dataset, tf.data.Dataset):
        dataset = getattr(dataset, "_original_dataset", None)
    return dataset if isinstance(dataset, tf.data.Dataset) else None


# An op of a dataset pipeline: its type, the attributes that bear on its
# order, and for a shuffle or random dataset its two seeds (None: unknown).
DatasetOp = collections.namedtuple("DatasetOp", "type attrs seeds")
_ORDER_ATTRS = (
    "seed",
    "seed2",
    "reshuffle_each_iteration",
    "rerandomize_each_iteration",
    "deterministic",
    "sloppy",
)


def dataset_ops(dataset):
    """The ops of `dataset` and of every dataset it reads, their functions' included.

    Walks the Python dataset objects (not a serialized graph, which would copy
    the tensors a pipeline holds, e.g. all of `fit`'s arrays). Returns a list
    of `DatasetOp`s, or None when a part cannot be read.
    """
    found, stack, seen = [], [dataset], set()
    try:
        while stack:
            each = stack.pop()
            if id(each) in seen:
                continue
            seen.add(id(each))
            found += _object_ops(each)
            for wrapper in each._functions():
                found += _graph_ops(wrapper.function.graph.as_graph_def())
            stack.extend(each._inputs())
    except (AttributeError, TypeError, ValueError):
        return None
    return found


def _object_ops(dataset):
    """What a dataset object itself does to the order (its op is made in C++)."""
    found = []
    if hasattr(dataset, "_reshuffle_each_iteration"):
        attrs = {"reshuffle_each_iteration": bool(dataset._reshuffle_each_iteration)}
        found.append(DatasetOp("ShuffleDataset", attrs, _object_seeds(dataset)))
    elif hasattr(dataset, "_rerandomize"):
        attrs = {"rerandomize_each_iteration": bool(dataset._rerandomize)}
        found.append(DatasetOp("RandomDataset", attrs, _object_seeds(dataset)))
    if getattr(dataset, "_deterministic", None) in ("false", False):
        found.append(
            DatasetOp(type(dataset).__name__, {"deterministic": "false"}, None)
        )
    return found


def _object_seeds(dataset):
    try:
        return (int(dataset._seed or 0), int(dataset._seed2 or 0))
    except TypeError:  # a tensor made in a traced function
        return None


def _graph_ops(graph):
    """The ops of a `GraphDef` and of its function library."""
    found = []
    for nodes in [graph.node] + [f.node_def for f in graph.library.function]:
        constants = {node.name: node for node in nodes if node.op == "Const"}
        for node in nodes:
            attrs = {
                name: _attr_value(name, node.attr[name])
                for name in _ORDER_ATTRS
                if name in node.attr
            }
            seeds = None
            if node.op.startswith(("Shuffle", "RandomDataset")):
                first = 0 if node.op.startswith("Random") else 2
                seeds = _constant_seeds(node.input[first : first + 2], constants)
            found.append(DatasetOp(node.op, attrs, seeds))
    return found


def _attr_value(name, value):
    if name == "deterministic":
        return value.s.decode()
    if name in ("seed", "seed2"):
        return value.i
    return value.b


def _constant_seeds(names, constants):
    seeds = []
    for name in names:
        constant = constants.get(name.split(":")[0].lstrip("^"))
        if constant is None:
            return None
        seeds.append(int(tf.make_ndarray(constant.attr["value"].tensor)))
    return tuple(seeds)


def missing_members():
    """Returns `[(where, member)]` for every listed member this install lacks."""
    import keras
    import numpy as np

    inputs = keras.Input((1,))
    model = keras.Model(inputs, keras.layers.Dense(1)(inputs))
    model.compile(optimizer="sgd", loss="mse")
    found = {}

    class Probe(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            found["fit"] = fit_input(self.model)
            self.model.stop_training = True

    model.fit(np.zeros((2, 1)), np.zeros((2, 1)), verbose=0, callbacks=[Probe()])
    epoch_iterator = found["fit"]
    owners = {
        "tf.data.Dataset.shuffle()": tf.data.Dataset.range(2).shuffle(2),
        "keras.Model": model,
        "keras.src.trainers.epoch_iterator.EpochIterator": epoch_iterator,
        "keras.src.backend.tensorflow.trainer.TFEpochIterator": epoch_iterator,
        "tf.data.Dataset": tf.data.Dataset,
    }
    missing = []
    for where, member, _ in PRIVATE_MEMBERS:
        if where == "keras.Model.fit":
            present = epoch_iterator is not None
        elif where == "tf.distribute.DistributedDataset":
            # Set in its constructor: read the class's source.
            source = inspect.getsource(importlib.import_module(_INPUT_LIB))
            present = f"self.{member} =" in source
        else:
            owner = owners[where]
            present = owner is not None and hasattr(owner, member)
        if not present:
            missing.append((where, member))
    return missing
