"""Which maskfit features run on which Keras backend, and the one refusal.

Keras 3 picks its backend once, at import (`KERAS_BACKEND`, or `"backend"` in
`~/.keras/keras.json`). maskfit runs on TensorFlow, JAX and PyTorch; a
feature that does not run on this process's backend is refused where it
enters (the constructor, the declaring call, the loading of a file that
holds it), with one `NotImplementedError` that names the backend, the
feature and what to use instead. `FEATURES` is the table README's "Backends" section shows
(`tests/test_backend_support.py` keeps the two in step).

`step_backend()` is the module of `maskfit.backend` that trains on this
process's backend. It is imported by name, at run time: the model classes and
`apply_gradients` (low in maskfit's layer order) reach the backend modules
(at the top of it, since they import the model, the step and pruning) only
through this function, never by an import statement.
"""

import importlib
from typing import NamedTuple

import keras

__all__ = [
    "BACKENDS",
    "FEATURES",
    "Feature",
    "backend",
    "check_backend",
    "require",
    "runs_on",
    "step_backend",
]

BACKENDS = ("tensorflow", "jax", "torch")
"""The Keras backends maskfit runs on; importing it under another one fails."""

_ON_TENSORFLOW = "run it under KERAS_BACKEND=tensorflow"


class Feature(NamedTuple):
    """One row of the backend table.

    Attributes:
      name: what the user calls, as README names it.
      backends: the Keras backends it runs on.
      instead: what to use on the other backends (empty where it runs on all).
    """

    name: str
    backends: tuple
    instead: str = ""


_BOTH = ("tensorflow", "jax")
_ALL = ("tensorflow", "jax", "torch")
_TF = ("tensorflow",)

FEATURES = {
    "model": Feature(
        "`MaskedModel`, `MaskedSequential`: `fit`, `evaluate`, `predict`", _ALL
    ),
    "masks": Feature(
        "`OutputMask`, `ElementMask`, `PiecewiseMask`, `set_mask` after compile",
        _ALL,
    ),
    "multipliers": Feature(
        "mask values as learning-rate multipliers, `layerwise_decay`, the recipes",
        _ALL,
    ),
    "apply_gradients": Feature("`maskfit.apply_gradients`", _ALL),
    "summary": Feature("`maskfit.summary`", _ALL),
    "mask_memory": Feature(
        "`maskfit.mask_memory` (the bytes of masks per device)",
        _BOTH,
        "run it under KERAS_BACKEND=tensorflow or KERAS_BACKEND=jax: the masks'"
        " layout is the same as under torch on one device (one mask value per"
        " masked entry or unit)",
    ),
    "saving": Feature(
        "`save` / `load_model` (a file saved under one backend loads under the others)",
        _ALL,
    ),
    "magnitude_pruning": Feature(
        "`maskfit.pruning`: `prune_low_magnitude` with TF-MOT's schedules in `fit`",
        _ALL,
    ),
    "structured_oneshot": Feature(
        "`select_units` (weight importances), `shrink`, `strip_pruning`",
        _ALL,
    ),
    "data_parallel": Feature(
        "`keras.distribution.DataParallel`",
        ("jax",),
        "under TensorFlow, `tf.distribute.MirroredStrategy`; Keras's torch"
        " backend has no `keras.distribution`: run it under KERAS_BACKEND=jax",
    ),
    "model_parallel": Feature(
        "`keras.distribution.ModelParallel` with a `LayoutMap` (each mask sharded"
        " like its variable)",
        ("jax",),
        "under TensorFlow, `tf.distribute.MirroredStrategy` (each replica holds"
        " the whole model and its masks); Keras's torch backend has no"
        " `keras.distribution`: run it under KERAS_BACKEND=jax",
    ),
    "structured_rule": Feature(
        "structured pruning while training (`maskfit.structured.prune_units`)"
        " with L1/L2, activation or your own weight importances",
        _BOTH,
        "prune under KERAS_BACKEND=tensorflow or KERAS_BACKEND=jax; the shrunk stock Keras"
        " model (`shrink`) loads and trains under torch",
    ),
    "derived_couplings": Feature(
        "couplings derived from a layer's computation (a block that no record"
        " or keras_hub spec names: its heads and FFN units)",
        _BOTH,
        "declare the layer's coupling (`maskfit_unit_coupling` or"
        " `maskfit.pruning.register_coupling`), or select its units under"
        " KERAS_BACKEND=jax or KERAS_BACKEND=tensorflow",
    ),
    "taylor_importance": Feature(
        "Taylor importances (`prune_units` or `select_units` with"
        ' `importance="taylor"`)',
        _BOTH,
        "an L1/L2 or activation importance (`ActivationImportance`) trains on"
        " every backend; for Taylor, run it under KERAS_BACKEND=tensorflow or"
        " KERAS_BACKEND=jax",
    ),
    "sparse_training": Feature(
        "dynamic sparse training (`maskfit.sparse`: `sparsify`, `SET`, `RigL`)",
        _BOTH,
        "a static sparse `ElementMask` trains on every backend; for SET or"
        " RigL, run it under KERAS_BACKEND=tensorflow or KERAS_BACKEND=jax",
    ),
    "custom_rules": Feature(
        "mask rules of your own (`MaskRule` subclasses, in `keras.ops` or"
        " TensorFlow ops)",
        _BOTH,
        "run it under KERAS_BACKEND=tensorflow or KERAS_BACKEND=jax",
    ),
    "exact_backup": Feature(
        "`maskfit.ExactBackupAndRestore` (resume at the exact step)",
        _BOTH,
        "`keras.callbacks.BackupAndRestore` resumes at epoch boundaries (not"
        " bit for bit); for an exact resume, run it under KERAS_BACKEND=tensorflow or KERAS_BACKEND=jax",
    ),
    "strategies": Feature(
        "`tf.distribute` strategies (`maskfit.distribute.make_strategy`)",
        _TF,
        "use `keras.distribution.DataParallel` under JAX, or " + _ON_TENSORFLOW,
    ),
    "custom_gradient": Feature(
        "`maskfit.custom_gradient`, `maskfit.reduce_to_shape`"
        " (on `tf.custom_gradient` or `jax.custom_gradient`)",
        _BOTH,
        "use `torch.autograd.Function` under torch (it checks gradient shapes"
        " itself), or run it under KERAS_BACKEND=tensorflow or KERAS_BACKEND=jax",
    ),
    "backprop_gate": Feature(
        "`OutputMask(..., backprop=True)` (no gradient from frozen units upstream)",
        _BOTH,
        "declare the mask with `backprop=False` (the layer's own frozen entries"
        " hold under torch too), or run it under KERAS_BACKEND=tensorflow or KERAS_BACKEND=jax",
    ),
}
"""Every feature by key: its name, its backends and what to use elsewhere."""


def backend():
    """The Keras backend of this process (`keras.backend.backend()`)."""
    return keras.backend.backend()


def step_backend():
    """The module of `maskfit.backend` for the Keras backend this process runs on.

    It provides `train_step`, `make_train_function`, `apply_grad_masks` and
    `apply_gradients` (`maskfit.backend` says what each does).

    Raises:
      RuntimeError: on a backend maskfit does not train on.

    Example:

    >>> step_backend().__name__ == f"maskfit.backend.{backend()}"
    True
    """
    name = backend()
    if name not in BACKENDS:
        raise RuntimeError(
            f"maskfit trains on the {', '.join(BACKENDS)} backends of Keras;"
            f" this process runs Keras on '{name}'. Set KERAS_BACKEND to one of"
            " them before importing Keras."
        )
    return importlib.import_module(f"maskfit.backend.{name}")


def runs_on(feature, name=None):
    """Whether `FEATURES[feature]` runs on backend `name` (default: this one)."""
    return (name or backend()) in FEATURES[feature].backends


def require(feature, where=None):
    """Raises the refusal of `FEATURES[feature]` when this backend cannot run it.

    Args:
      feature: a key of `FEATURES`.
      where: what the user called, when the feature's name does not say it
        (e.g. `"layer 'dense' (a RigL rule)"`).

    Raises:
      NotImplementedError: naming the backend, the feature, the backends it
        runs on and what to use instead.

    Example:

    >>> require("model")  # runs everywhere: nothing happens
    """
    row = FEATURES[feature]
    name = backend()
    if name in row.backends:
        return
    called = f" ({where})" if where else ""
    raise NotImplementedError(
        f"{row.name}{called} is not supported on the Keras backend '{name}'"
        f" (KERAS_BACKEND={name}); it runs on {', '.join(row.backends)}."
        f" Instead: {row.instead}."
    )


def check_backend(name=None):
    """Raises an ImportError when maskfit cannot run on Keras backend `name`.

    Nothing of maskfit (its training step, the self-check of output units,
    pruning) runs on a backend outside `BACKENDS`, so importing it there fails
    at once rather than in `fit`.

    Raises:
      ImportError: naming the backend, the ones maskfit runs on and how to
        choose one.
    """
    name = name or backend()
    if name in BACKENDS:
        return
    raise ImportError(
        f"maskfit runs on the Keras backends {', '.join(BACKENDS)}; this"
        f" process uses '{name}' (KERAS_BACKEND={name}), which maskfit does not"
        " support. Set KERAS_BACKEND=tensorflow, KERAS_BACKEND=jax or"
        " KERAS_BACKEND=torch before the first `import keras` (README's table"
        " says what runs where)."
    )
