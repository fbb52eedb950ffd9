"""How maskfit names a model's layers and variables in what it saves.

A layer's path joins layer names from the model down (`"encoder/dense_1"`),
so it names the same layer in a model rebuilt from its config; a variable's
key is its innermost layer's path and its name (`"encoder/dense_1/kernel"`).
Keras's own `variable.path` does not do that: it records the name scopes the
variable was built under, which differ between a subclassed model built by
`fit` and the same model rebuilt by `load_model`. Saved masks and rules are
keyed by layer path, saved keep masks and the optimizer's layout by variable
key. `handle` gives the `tf.Variable` that the step assigns.
"""

import difflib

import keras

from maskfit import internals

__all__ = ["handle", "layer_at", "layer_paths", "variable_keys"]


def handle(variable):
    """The `tf.Variable` behind a Keras variable (itself for a TF variable)."""
    return variable.value if isinstance(variable, keras.Variable) else variable


def layer_paths(model):
    """Returns `{path: layer}` for every layer nested in `model`, outer ones first.

    A layer reachable along several paths (a shared layer) has the first.
    """
    paths = {}

    def walk(layer, prefix):
        for child in internals.sublayers(layer, recursive=False):
            path = prefix + child.name
            if path not in paths:
                paths[path] = child
                walk(child, path + "/")

    walk(model, "")
    return paths


def layer_at(model, layers, path, what):
    """Returns `layers[path]`, for `layers` from `layer_paths(model)`.

    Raises:
      ValueError: naming the path, the closest one and every layer's, when
        the saved `what` (e.g. "gradient masks") name a layer `model` lacks.
    """
    layer = layers.get(path)
    if layer is None:
        close = difflib.get_close_matches(path, list(layers), n=1)
        hint = f" Did you mean '{close[0]}'?" if close else ""
        raise ValueError(
            f"The saved {what} name layer '{path}', which model"
            f" '{model.name}' does not have.{hint} Its layers are"
            f" {sorted(layers)}."
        )
    return layer


def variable_keys(model, variables):
    """One key per variable of `model`: its innermost layer's path and its name.

    Where several variables would share a key, the second and later get
    `"#2"`, `"#3"`... in list order.

    Example:

    >>> import keras
    >>> inputs = keras.Input((2,))
    >>> model = keras.Model(inputs, keras.layers.Dense(1, name="head")(inputs))
    >>> variable_keys(model, model.trainable_variables)
    ['head/kernel', 'head/bias']
    """
    owner = {}
    for path, layer in layer_paths(model).items():
        for variable in layer.weights:
            owner[id(variable)] = path  # inner layers come later and win
    seen = {}
    keys = []
    for variable in variables:
        path = owner.get(id(variable))
        key = variable.name if not path else f"{path}/{variable.name}"
        seen[key] = seen.get(key, 0) + 1
        keys.append(key if seen[key] == 1 else f"{key}#{seen[key]}")
    return keys
