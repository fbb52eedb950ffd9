"""Private members of Keras optimizers that maskfit reads or hooks.

Checked on Keras 3.10.0 with TF 2.16.2 and on Keras 3.15.1 with TF 2.21.0.
"""

import keras

from maskfit.internals.models import defining_class, set_method

# (where, member, what it is for).
PRIVATE_MEMBERS = (
    (
        "keras.optimizers.Optimizer",
        "_trainable_variables",
        "the variables an optimizer was built for: MaskedModel builds it for"
        " the learnable ones only, and rebuilds it when that set changes; no"
        " public property lists them.",
    ),
    (
        "keras.optimizers.Optimizer",
        "_variables",
        "the optimizer's own variable list, emptied of its slots to rebuild it"
        " in place (Keras optimizers cannot be built twice).",
    ),
    (
        "keras.optimizers.Optimizer",
        "_trainable_variables_indices",
        "the optimizer's variable-to-slot index, reset with `_variables`.",
    ),
    (
        "keras.optimizers.Optimizer",
        "_iterations",
        "the step counter variable itself: `iterations` divides it by"
        " `gradient_accumulation_steps`; rebuilding an optimizer keeps it.",
    ),
    (
        "keras.optimizers.Optimizer",
        "_learning_rate",
        "the learning-rate variable (absent for a schedule): rebuilding an"
        " optimizer keeps it, and it is not a per-variable slot.",
    ),
    (
        "keras.optimizers.Optimizer",
        "_var_key",
        "the key an optimizer files a variable under: the same for a Keras"
        " variable, its tf.Variable and, under a strategy, each replica's"
        " component, which is what `update_step` is handed (learning-rate"
        " multipliers are looked up by it).",
    ),
    (
        "keras.optimizers.Optimizer",
        "_apply_weight_decay",
        "the decoupled weight decay, run on all variables before any"
        " `update_step`; hooked per instance (for one traced update) so that"
        " each variable with a learning-rate multiplier decays alone, at its"
        " learning rate x m.",
    ),
    (
        "keras.optimizers.Optimizer",
        "_get_current_learning_rate",
        "what the public `learning_rate` property returns (a property cannot"
        " be overridden on an instance): hooked likewise, so that a scaled"
        " variable's weight decay reads learning_rate x m.",
    ),
    (
        "keras.optimizers.Optimizer",
        "_model_variables_moving_average",
        "the EMA averages, aligned with `_trainable_variables`: a frozen"
        " entry's average is pinned so that `finalize_variable_values` cannot"
        " move it, and a newly learnable variable's average starts at its value.",
    ),
)


def optimizer_built_variables(optimizer):
    """The variables `optimizer` was built for, in its order.

    A `LossScaleOptimizer` of Keras 3.10 does not record them (its `build`
    skips the base class's): they are those of the optimizer it wraps.
    """
    built = optimizer._trainable_variables
    inner = getattr(optimizer, "inner_optimizer", None)
    if not built and inner is not None and inner.built:
        return optimizer_built_variables(inner)
    return built


def optimizers_within(optimizer):
    """`optimizer` and every optimizer it wraps, depth first.

    A `LossScaleOptimizer`'s `inner_optimizer`, a `MultiOptimizer`'s
    `optimizers` (Keras 3.15+), and theirs.
    """
    found = [optimizer]
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        found += optimizers_within(optimizer.inner_optimizer)
    multi = getattr(keras.optimizers, "MultiOptimizer", None)
    if multi is not None and isinstance(optimizer, multi):
        for child in optimizer.optimizers:
            found += optimizers_within(child)
    return found


def optimizer_state(optimizer):
    """Splits the variables one optimizer made in `build` into slots and its own.

    Returns `(slots, own)`: `slots` maps `(attribute, id(model variable))` to
    the slot kept in that attribute (a list aligned with the variables the
    optimizer was built for, as every Keras optimizer keeps them:
    `_momentums`, `_r`, `_model_variables_moving_average`...); `own` lists the
    other variables it made in `build` (Nadam's momentum product, a loss scale),
    in order. Its iterations and learning rate are in neither.
    """
    built = list(optimizer._trainable_variables)
    slots, in_slots = {}, set()
    for attribute, value in sorted(vars(optimizer).items()):
        if (
            isinstance(value, list)
            and value is not optimizer._variables
            and value is not optimizer._trainable_variables
            and len(value) == len(built)
            and any(isinstance(x, keras.Variable) for x in value)
            and all(x is None or isinstance(x, keras.Variable) for x in value)
            and not any(x is y for x, y in zip(value, built))
        ):
            for variable, slot in zip(built, value):
                if slot is not None:
                    slots[(attribute, id(variable))] = slot
                    in_slots.add(id(slot))
    fixed = (optimizer._iterations, getattr(optimizer, "_learning_rate", None))
    own = [
        v
        for v in optimizer._variables
        if id(v) not in in_slots and not any(v is f for f in fixed)
    ]
    return slots, own


def ema_averages_by_variable(optimizer):
    """Maps `id(model variable)` to its EMA average in `optimizer` ({} without EMA)."""
    averages = getattr(optimizer, "_model_variables_moving_average", None)
    if not getattr(optimizer, "use_ema", False) or not averages:
        return {}
    return {
        id(v): a
        for v, a in zip(optimizer._trainable_variables, averages)
        if a is not None
    }


class OptimizerStructure:
    """Enough of an optimizer's structure to put a failed rebuild back."""

    def __init__(self, optimizer):
        self._saved = [
            (each, list(each._variables), dict(vars(each)))
            for each in optimizers_within(optimizer)
        ]

    def restore(self):
        for each, own, attributes in self._saved:
            vars(each).update(attributes)
            each._variables[:] = own


def reset_optimizer(optimizer):
    """Makes a built optimizer unbuilt again, keeping its iterations and learning rate.

    Its slots are dropped; `optimizer.build(variables)` makes new ones.
    """
    for each in optimizers_within(optimizer):
        fixed = (each._iterations, getattr(each, "_learning_rate", None))
        # In place: the optimizer's tracker holds this very list.
        each._variables[:] = [v for v in each._variables if any(v is f for f in fixed)]
        each._trainable_variables = []
        each._trainable_variables_indices = {}
        each.built = False


def variable_key(optimizer, variable):
    """The key `optimizer` files `variable` under (a Keras variable, its
    tf.Variable, or a replica's component of it)."""
    return optimizer._var_key(variable)


def weight_decay_owner(optimizer_class):
    """The class whose `_apply_weight_decay` instances of `optimizer_class` run."""
    return defining_class(optimizer_class, "_apply_weight_decay")


def hook_weight_decay(optimizer, hook):
    """Makes `optimizer` apply weight decay with `hook(original, variables)`.

    Returns a function that undoes it.
    """
    original = optimizer._apply_weight_decay
    return set_method(
        optimizer, "_apply_weight_decay", lambda variables: hook(original, variables)
    )


def hook_current_learning_rate(optimizer, hook):
    """Makes `optimizer.learning_rate` return `hook(original)`; returns the undo."""
    original = optimizer._get_current_learning_rate
    return set_method(optimizer, "_get_current_learning_rate", lambda: hook(original))


def missing_members():
    """Returns `[(where, member)]` for every listed member this install lacks."""
    inputs = keras.Input((1,))
    model = keras.Model(inputs, keras.layers.Dense(1)(inputs))
    optimizer = keras.optimizers.Adam(use_ema=True)
    optimizer.build(model.trainable_variables)
    return [(w, m) for w, m, _ in PRIVATE_MEMBERS if not hasattr(optimizer, m)]
