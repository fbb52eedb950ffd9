"""Private members of Keras models, layers and TensorFlow's tracing that maskfit reads.

Checked on Keras 3.10.0 with TF 2.16.2 and on Keras 3.15.1 with TF 2.21.0.
"""

import contextlib
import importlib

import keras
import tensorflow as tf

# (where, member, what it is for).
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
    (
        "keras.src.applications.inception_resnet_v2",
        "CustomScaleLayer",
        "the residual scaling layer of `keras.applications.InceptionResNetV2`"
        " (`inputs[0] + inputs[1] * scale`), which Keras does not export:"
        " structured pruning couples it as an element-wise merge.",
    ),
    (
        "keras.src.applications.convnext",
        "LayerScale",
        "the per-channel scale of `keras.applications.ConvNeXt*` blocks, which"
        " Keras does not export: structured pruning passes channels through it.",
    ),
    (
        "keras.src.backend.common.global_state",
        "get_global_attribute",
        "the list of variables made in a `StatelessScope(initialize_variables="
        "False)`, which the next scope's exit initializes: layers built only"
        " for their weights' shapes take theirs out; no public API does.",
    ),
    (
        "keras.src.backend.common.global_state",
        "set_global_attribute",
        "puts that list back as it was.",
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


def tracing_for_xla():
    """Whether the ops made now will be compiled with XLA (`jit_compile=True`)."""
    graph = tf.compat.v1.get_default_graph()
    util = _module("tensorflow.python.ops.control_flow_util")
    return util.GraphOrParentsInXlaContext(graph)


def conv_lstm_cell_class():
    """Returns the cell class of Keras's `ConvLSTM1D/2D/3D` layers."""
    return _module("keras.src.layers.rnn.conv_lstm").ConvLSTMCell


def application_layer_classes():
    """`{name: class}` of the layers keras.applications defines without exporting.

    `CustomScaleLayer` (InceptionResNetV2) and `LayerScale` (ConvNeXt); a
    Keras release without one leaves it out.
    """
    found = {}
    for where, member, _ in PRIVATE_MEMBERS:
        if where.startswith("keras.src.applications."):
            cls = getattr(_module(where), member, None)
            if cls is not None:
                found[member] = cls
    return found


@contextlib.contextmanager
def shapes_only():
    """A scope whose new variables get shapes and no values, and are then forgotten.

    A layer built inside it has weights of the right shapes without running
    an initializer (nothing is computed or compiled); it cannot be called
    outside a `StatelessScope` that maps its weights to values.
    """
    state = _module("keras.src.backend.common.global_state")
    before = list(state.get_global_attribute("uninitialized_variables") or [])
    try:
        with keras.StatelessScope(initialize_variables=False):
            yield
    finally:
        state.set_global_attribute("uninitialized_variables", before)


def defining_class(cls, name):
    """The class in `cls`'s MRO that defines attribute `name`."""
    return next(c for c in cls.__mro__ if name in vars(c))


def missing_members():
    """Returns `[(where, member)]` for every listed member this install lacks.

    Members of `keras.Model` are looked up on a small compiled model, since
    Keras sets some of them on the instance.
    """
    inputs = keras.Input((1,))
    model = keras.Model(inputs, keras.layers.Dense(1)(inputs))
    model.compile(optimizer="sgd", loss="mse")
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
        else:
            try:
                owner = _module(where)
            except ImportError:
                missing.append((where, member))
                continue
        if not hasattr(owner, member):
            missing.append((where, member))
    return missing
