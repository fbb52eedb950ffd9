"""Which inputs a resumed `fit` can skip into exactly, and why not the others.

A resumed epoch skips the batches already trained by reading them again from a
fresh pass over the input. That is exact when a fresh pass in a new process
yields the batches the interrupted run got, in the same order:
- arrays, unshuffled, or shuffled with a global seed set
  (`keras.utils.set_random_seed`): with a seed, Keras 3.15 on TensorFlow 2.21
  draws the same permutation on every pass, in every process;
- a `tf.data.Dataset` whose order does not change from pass to pass: no
  `shuffle()` that reshuffles each iteration or has no seed, no unseeded
  random op, no `tf.random.Generator`, no Python code (`from_generator`,
  `py_function`), no `deterministic=False`;
- a `keras.utils.PyDataset` whose `__getitem__` depends on the index and on
  what `on_epoch_begin` sets (the backup restores the global random states it
  may draw from), not on state that `on_epoch_end` changes.
`hazards` says what in an input breaks that, for one warning when `fit` starts.
"""

import keras
import tensorflow as tf

from maskfit.internals import data as internals

__all__ = ["dataset_hazards", "hazards"]

_SHUFFLES = {
    "ShuffleDataset",
    "ShuffleDatasetV2",
    "ShuffleDatasetV3",
    "ShuffleAndRepeatDataset",
    "ShuffleAndRepeatDatasetV2",
}
_RANDOM_DATASETS = {"RandomDataset", "RandomDatasetV2"}
_SEEDED_OPS = {"Multinomial", "TruncatedNormal", "ParameterizedTruncatedNormal"}
_GENERATOR_OPS = {"RngReadAndSkip", "RngSkip", "NonDeterministicInts"}
_PYTHON_OPS = {"PyFunc", "PyFuncStateless", "EagerPyFunc"}


def hazards(epoch_iterator):
    """Returns why `fit`'s input cannot be skipped into exactly ([] if it can).

    Args:
      epoch_iterator: `fit`'s `EpochIterator` (`internals.fit_input`), or None.
    """
    if epoch_iterator is None:
        return [
            "maskfit cannot see fit's input with this Keras version, so it cannot"
            " check that a new pass over it yields the same batches"
        ]
    adapter = getattr(epoch_iterator, "data_adapter", None)
    kind = type(adapter).__name__
    if kind == "ArrayDataAdapter":
        dataset = internals.fit_dataset(epoch_iterator)
        found = dataset_hazards(dataset) if dataset is not None else []
        # Keras's pipeline for arrays draws nothing at random but the
        # permutation of a shuffled fit.
        if any("has no seed" in reason for reason in found):
            return [
                "the arrays are shuffled (fit's shuffle=True) with no global seed,"
                " so a restarted process draws another permutation; call"
                " keras.utils.set_random_seed(seed) before fit"
            ]
        return found
    if kind == "TFDatasetAdapter":
        dataset = adapter.get_tf_dataset()
        if not isinstance(dataset, tf.data.Dataset):
            return [
                "the input is a distributed dataset, whose order maskfit does not check"
            ]
        return dataset_hazards(dataset)
    if kind == "PyDatasetAdapter":
        py_dataset = adapter.py_dataset
        cls = type(py_dataset)
        if cls.on_epoch_end is not keras.utils.PyDataset.on_epoch_end:
            return [
                f"{cls.__name__}.on_epoch_end may change what later epochs read,"
                " and a restarted process does not replay it; draw each epoch's"
                " order in on_epoch_begin from NumPy's or Python's global random"
                " state (the backup restores both)"
            ]
        return []
    if kind == "GeneratorDataAdapter":
        return [
            "the input is a Python generator, which maskfit cannot check yields"
            " the same batches when it is made again"
        ]
    return [f"maskfit does not check inputs of {kind}"]


def dataset_hazards(dataset):
    """Returns what makes a new pass over `dataset` yield another order ([] if nothing)."""
    ops = internals.dataset_ops(dataset)
    if ops is None:
        return ["the dataset's pipeline cannot be read, so its order cannot be checked"]
    found = []
    if dataset.options().deterministic is False:
        found.append("its options set deterministic=False")
    for op in ops:
        reason = _op_hazard(op)
        if reason is not None and reason not in found:
            found.append(reason)
    return found


def _op_hazard(op):
    kind, attrs = op.type, op.attrs
    if kind in _SHUFFLES:
        # ShuffleDatasetV2 has no such attribute: it always reshuffles.
        if attrs.get("reshuffle_each_iteration", True):
            return (
                "shuffle() reshuffles on every pass (reshuffle_each_iteration=True,"
                " the default), so a restarted process shuffles a later epoch"
                " differently; pass reshuffle_each_iteration=False"
            )
        if op.seeds in (None, (0, 0)):
            return "shuffle() has no seed; pass seed=... or set a global seed"
        return None
    if kind in _RANDOM_DATASETS:
        if attrs.get("rerandomize_each_iteration", False):
            return "a random dataset re-randomizes on every pass"
        if op.seeds in (None, (0, 0)):
            return "a random dataset (e.g. sample_from_datasets) has no seed"
        return None
    if (kind.startswith("Random") or kind in _SEEDED_OPS) and "seed" in attrs:
        if attrs["seed"] == 0 and attrs.get("seed2", 0) == 0:
            return f"a random op ({kind}) has no seed"
        return None
    if kind.startswith("Stateful") or kind in _GENERATOR_OPS:
        return (
            f"a tf.random.Generator ({kind}) draws numbers whose state the backup"
            " does not hold"
        )
    if kind in _PYTHON_OPS:
        return (
            "it runs Python code (from_generator, py_function or numpy_function)"
            " that maskfit cannot check"
        )
    if kind.startswith("DataService"):
        return "it reads from the tf.data service"
    if attrs.get("deterministic") == "false" or attrs.get("sloppy", False):
        return f"{kind} runs with deterministic=False"
    return None
