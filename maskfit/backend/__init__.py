"""What maskfit does differently per Keras backend, behind one small interface.

`current()` is the module of the backend Keras runs on
(`keras.backend.backend()`, fixed when Keras is imported):
`maskfit.backend.tensorflow` or `maskfit.backend.jax`. Each provides

- `train_step(model, *args)`: `MaskedModel.train_step`, in the signature
  that backend's Keras trainer calls (`(data)` on TensorFlow,
  `(state, data)` on JAX);
- `make_train_function(model, keras_make, force)`: `make_train_function`;
- `apply_gradients(optimizer, grads, variables)`: `maskfit.apply_gradients`.

What does not depend on the backend is shared: the declarations
(`maskfit.spec`), their resolution against variables
(`maskfit.step.declared`), and the masking stage as a pure function in
`keras.ops` (`maskfit.step.stateless`), which the JAX backend runs and a
PyTorch backend could run too. The TensorFlow backend keeps its own stateful
step (`maskfit.step.masker`, `maskfit.step.lifecycle`).

It imports `internals`, `paths`, `spec`, `step` and `apply`; `jax_rules`
also reads `model.training`, and `jax` imports `pruning.rule` inside a
function (that package imports this one).
"""

import importlib

import keras

__all__ = ["NAME", "SUPPORTED", "current"]

NAME = keras.backend.backend()
# The backends maskfit trains on, by `keras.backend.backend()` name.
SUPPORTED = ("tensorflow", "jax")


def current():
    """The module of the backend Keras runs on.

    Raises:
      RuntimeError: on a backend maskfit does not train on.

    Example:

    >>> from maskfit import backend
    >>> backend.current().__name__ == f"maskfit.backend.{backend.NAME}"
    True
    """
    if NAME not in SUPPORTED:
        raise RuntimeError(
            f"maskfit trains on the {' and '.join(SUPPORTED)} backends of Keras;"
            f" this process runs Keras on '{NAME}'. Set KERAS_BACKEND=jax or"
            " KERAS_BACKEND=tensorflow before importing Keras."
        )
    return importlib.import_module(f"maskfit.backend.{NAME}")
