"""Every private Keras and TensorFlow member maskfit touches, in one place.

Keras 3 has no public API for a few things a drop-in `keras.Model` needs. Each
accessor below names the private member it reads, what it is for, what public
API is missing, and the versions it was checked on. `PRIVATE_MEMBERS` lists them
all; `tests/test_internals.py` fails with the member's name when a Keras or
TensorFlow release removes one. No other maskfit module names a private member.
"""

import importlib

import keras
import tensorflow as tf

__all__ = [
    "PRIVATE_MEMBERS",
    "OptimizerStructure",
    "attention_output_dense",
    "call_has_training_arg",
    "compute_loss",
    "conv_lstm_cell_class",
    "defining_class",
    "ema_averages_by_variable",
    "functional_class",
    "hook_current_learning_rate",
    "hook_weight_decay",
    "loss_tracker",
    "merge_call",
    "missing_members",
    "optimizer_built_variables",
    "optimizer_state",
    "optimizers_within",
    "reset_optimizer",
    "set_method",
    "set_untracked",
    "sublayers",
    "tracing_for_xla",
    "unscale_loss_for_distribution",
    "variable_key",
    "weight_decay_owner",
]

# (where, member, what it is for). Checked on Keras 3.10.0 with TF 2.16.2 and on
# Keras 3.15.1 with TF 2.21.0, the two ends CI tests (tests/test_internals.py).
PRIVATE_MEMBERS = (
    (
        "keras.layers.Layer",
        "_flatten_layers",
        "every layer nested in a model or layer (masks and pruning rules are"
        " declared on layers anywhere in it; an RNN's cell, a wrapper's layer);"
        " Keras has no public recursive walk (`model.layers`"
        " lists direct children of functional and Sequential models only).",
    ),
    (
        "keras.layers.GroupQueryAttention",
        "_output_dense",
        "its output projection, whose columns belong to output units;"
        " MultiHeadAttention exposes `output_dense`, GroupQueryAttention not.",
    ),
    (
        "keras.src.models.functional",
        "Functional",
        "the functional model class, which Keras exports only through"
        " keras.src: `MaskedModel(inputs, outputs)` mixes it in without"
        " rewriting any class's bases.",
    ),
    (
        "keras.Model",
        "_call_has_training_arg",
        "whether `call` takes `training`: the stock train_step passes it only"
        " then; no public property says so.",
    ),
    (
        "keras.Model",
        "_compute_loss",
        "Keras's wrapper that calls a `compute_loss` override with or without"
        " the `training` argument (added in Keras 3.3); train_step must call"
        " it to support both kinds of override.",
    ),
    (
        "keras.Model",
        "_loss_tracker",
        "the `loss` metric the stock train_step updates; public `metrics`"
        " lists it only once the model has been trained or evaluated.",
    ),
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
    (
        "tf.__internal__.distribute.interim",
        "maybe_merge_call",
        "runs the restore of frozen entries once per variable in cross-replica"
        " context (under a strategy) or directly (without one), as Keras's own"
        " optimizer does; `tf.distribute.get_replica_context().merge_call`"
        " alone fails outside a strategy.",
    ),
    (
        "keras.src.losses.loss",
        "unscale_loss_for_distribution",
        "undoes the division by the number of replicas before the loss is"
        " tracked, as the stock train_step does.",
    ),
    (
        "tensorflow.python.ops.control_flow_util",
        "GraphOrParentsInXlaContext",
        "whether ops are being traced for XLA (`jit_compile=True`), where"
        " `top_k` needs a static k: magnitude pruning then sorts every entry,"
        " and takes only the kept ones otherwise; no public API tells.",
    ),
    (
        "keras.src.layers.rnn.conv_lstm",
        "ConvLSTMCell",
        "the class of `ConvLSTM1D/2D/3D(...).cell`, which Keras does not"
        " export: the pruning registry names its prunable kernels.",
    ),
)


def _module(name):
    return importlib.import_module(name)


def set_untracked(obj, name, value):
    """Sets attribute `name` of a layer, model or optimizer, untracked.

    Keras's `Layer.__setattr__` (and TensorFlow's `AutoTrackable` under it)
    track what is assigned: lists and dicts become tracked wrappers,
    variables join the layer's weights, and a built layer refuses new state.
    maskfit's own bookkeeping on Keras objects (a layer's mask spec, rule and
    unit-layout cache, the backprop gate's wrapped `call`, a model's training
    lifecycle) is none of that: it is set past the trackers, here only.
    """
    object.__setattr__(obj, name, value)


def functional_class():
    """Returns Keras's `Functional` model class."""
    return _module("keras.src.models.functional").Functional


def call_has_training_arg(model):
    """Whether `model.call` accepts a `training` argument."""
    return model._call_has_training_arg


def compute_loss(model, **kwargs):
    """Calls `model.compute_loss`, with `training` only if the override takes it."""
    return model._compute_loss(**kwargs)


def loss_tracker(model):
    """Returns the model's `loss` metric, or None before `compile()`."""
    return model._loss_tracker


def unscale_loss_for_distribution(loss):
    """Multiplies `loss` back by the number of replicas in sync."""
    return _module("keras.src.losses.loss").unscale_loss_for_distribution(loss)


def sublayers(layer, recursive=True):
    """The layers `layer` tracks (itself excluded), depth first, each once.

    With `recursive=False`, only those it tracks directly.
    """
    return list(layer._flatten_layers(include_self=False, recursive=recursive))


def attention_output_dense(layer):
    """A `GroupQueryAttention`'s output projection (an `EinsumDense`)."""
    return layer._output_dense


def merge_call(fn, strategy, *args):
    """Calls `fn(distribution, *args)` in cross-replica context, with or without a strategy.

    Already in cross-replica context (eager code under a strategy's scope,
    outside its `run`), `fn` is called as it is.
    """
    if tf.distribute.in_cross_replica_context():
        return fn(strategy, *args)
    return tf.__internal__.distribute.interim.maybe_merge_call(fn, strategy, *args)


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


def defining_class(cls, name):
    """The class in `cls`'s MRO that defines attribute `name`."""
    return next(c for c in cls.__mro__ if name in vars(c))


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


_MISSING = object()


def set_method(obj, name, function):
    """Sets instance attribute `name` of `obj`, untracked; returns a function that undoes it."""
    previous = vars(obj).get(name, _MISSING)
    set_untracked(obj, name, function)

    def undo():
        if previous is _MISSING:
            object.__delattr__(obj, name)
        else:
            set_untracked(obj, name, previous)

    return undo


def tracing_for_xla():
    """Whether the ops made now will be compiled with XLA (`jit_compile=True`)."""
    graph = tf.compat.v1.get_default_graph()
    util = _module("tensorflow.python.ops.control_flow_util")
    return util.GraphOrParentsInXlaContext(graph)


def conv_lstm_cell_class():
    """Returns the cell class of Keras's `ConvLSTM1D/2D/3D` layers."""
    return _module("keras.src.layers.rnn.conv_lstm").ConvLSTMCell


def missing_members():
    """Returns `[(where, member)]` for every listed member this install lacks.

    Members of `keras.Model` are looked up on a small compiled model, since
    Keras sets some of them on the instance.
    """
    inputs = keras.Input((1,))
    model = keras.Model(inputs, keras.layers.Dense(1)(inputs))
    model.compile(optimizer="sgd", loss="mse")
    optimizer = keras.optimizers.Adam(use_ema=True)
    optimizer.build(model.trainable_variables)
    missing = []
    for where, member, _ in PRIVATE_MEMBERS:
        if where in ("keras.Model", "keras.layers.Layer"):
            owner = model
        elif where == "keras.layers.GroupQueryAttention":
            owner = keras.layers.GroupQueryAttention(2, 2, 1, 1)
            owner.build((1, 2, 4), (1, 2, 4))
        elif where.startswith("tf."):
            owner = tf
            for part in where.split(".")[1:]:
                owner = getattr(owner, part, None)
        elif where == "keras.optimizers.Optimizer":
            owner = optimizer
        else:
            try:
                owner = _module(where)
            except ImportError:
                missing.append((where, member))
                continue
        if not hasattr(owner, member):
            missing.append((where, member))
    return missing
