"""The private Keras and TensorFlow members the exact backup touches, in one place.

A callback sees neither `fit`'s input nor how far into it an epoch is, and it
cannot tell `fit` where to start: Keras's own `BackupAndRestore` sets a private
attribute for that. Each accessor names the private member, what it is for and
what public API is missing. Checked on Keras 3.10.0 with TF 2.16.2 and Keras
3.15.1 with TF 2.21.0; `missing_members` backs `tests/test_exact_resume.py`'s
check. (Meant to join `maskfit/internals.py` once the core restructure lands.)
"""

import importlib
import inspect

import tensorflow as tf

__all__ = [
    "PRIVATE_MEMBERS",
    "dataset_graph",
    "fit_dataset",
    "fit_input",
    "iterator_kept",
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
        "_as_serialized_graph",
        "the dataset's graph, to find what makes its order differ from one"
        " pass or process to the next (unseeded or reshuffling shuffles,"
        " Python code, non-deterministic parallelism).",
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


def fit_dataset(epoch_iterator):
    """The `tf.data.Dataset` that `fit` iterates, or None when it cannot be read."""
    dataset = getattr(epoch_iterator, "_distributed_dataset", None)
    if dataset is not None and not isinstance(dataset, tf.data.Dataset):
        dataset = getattr(dataset, "_original_dataset", None)
    return dataset if isinstance(dataset, tf.data.Dataset) else None


def dataset_graph(dataset):
    """The `GraphDef` of `dataset`, its functions included; None if it cannot be serialized."""
    from tensorflow.core.framework import graph_pb2

    ignore = tf.data.experimental.ExternalStatePolicy.IGNORE
    try:
        serialized = dataset._as_serialized_graph(external_state_policy=ignore)
    except (tf.errors.OpError, TypeError, ValueError):
        return None
    graph = graph_pb2.GraphDef()
    graph.ParseFromString(serialized.numpy())
    return graph


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
