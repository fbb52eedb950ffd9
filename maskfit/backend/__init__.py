"""What maskfit does differently per Keras backend, behind one small interface.

`current()` is the module of the backend Keras runs on
(`keras.backend.backend()`, fixed when Keras is imported):
`maskfit.backend.tensorflow` or `maskfit.backend.jax`. Each provides

- `train_step(model, *args)`: `MaskedModel.train_step`, in the signature
  that backend's Keras trainer calls (`(data)` on TensorFlow,
  `(state, data)` on JAX);
- `make_train_function(model, keras_make, force)`: `make_train_function`;
- `apply_gradients(optimizer, grads, variables)`: `maskfit.apply_gradients`;
- `place_masks(masks, variables)`, JAX only: `StatelessMasks` laid out like
  their variables under a `keras.distribution` (`maskfit.stateless_masks`).

This package is the top of maskfit's layer order (it imports the model, the
step and pruning); the layers below reach it only through
`maskfit.support.step_backend()`, by name at run time. What does not depend
on the backend is shared: the declarations
(`maskfit.spec`), their resolution against variables
(`maskfit.step.declared`), and the masking stage as a pure function in
`keras.ops` (`maskfit.step.stateless`), which the JAX backend runs and a
PyTorch backend could run too. The TensorFlow backend keeps its own stateful
step (`maskfit.step.masker`, `maskfit.step.lifecycle`).

It imports `internals`, `paths`, `spec`, `step` and `apply`; `jax_rules`
also reads `model.training`, and `jax` imports `pruning.rule` inside a
function (that package imports this one).
"""

from maskfit import support

__all__ = ["NAME", "SUPPORTED", "current"]

NAME = support.backend()
# The backends maskfit trains on, by `keras.backend.backend()` name.
SUPPORTED = support.BACKENDS


def current():
    """The module of the backend Keras runs on (`maskfit.support.step_backend`).

    Raises:
      RuntimeError: on a backend maskfit does not train on.

    Example:

    >>> from maskfit import backend
    >>> backend.current().__name__ == f"maskfit.backend.{backend.NAME}"
    True
    """
    return support.step_backend()
