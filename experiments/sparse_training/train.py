"""Training for the sparse training experiment: models, methods, one training run.

`build_model` makes a task's network (an MLP, or MNIST-1D's small 1-D CNN)
as a `maskfit.MaskedModel` with named layers; `declare_method` makes it
dense, static sparse, gradually pruned, SET or RigL at one sparsity;
`train` runs one (task, method, sparsity, seed) for the step budget and
returns its test accuracy curve and how many kernel weights were non-zero.
`experiments.sparse_training.lib` runs the grid with these.
"""

import math
import time

import keras
import numpy as np
import tensorflow as tf

import maskfit
from experiments import common
from experiments.common import datasets
from maskfit import pruning, sparse

__all__ = [
    "DYNAMIC_METHODS",
    "METHODS",
    "MODELS",
    "build_model",
    "declare_method",
    "load_data",
    "train",
]

# Every method the experiment knows, in the order of tables and figures.
METHODS = ("dense", "static", "set", "rigl", "pruning")
# The methods that change the mask inside the step and grow entries.
DYNAMIC_METHODS = ("set", "rigl")
MODELS = ("mlp", "cnn")


def load_data(name):
    """The `experiments.common.datasets` split of `name` ("mnist1d" or "digits")."""
    return datasets.load(name)


def build_model(model_name, features, classes, config):
    """A `MaskedModel` for `model_name`; its prunable layers' names are fixed.

    - "mlp": `config.mlp_units` ReLU layers and a linear head (MNIST-1D's MLP
      is 100-100).
    - "cnn": MNIST-1D's ConvBase: 1-D convolutions of `config.cnn_filters`
      channels (kernel 5, then 3; stride 2; ReLU), flattened into a linear
      head.
    """
    inputs = keras.Input((features,), name="inputs")
    hidden = inputs
    if model_name == "mlp":
        for index, units in enumerate(config.mlp_units):
            hidden = keras.layers.Dense(
                units, activation="relu", name=f"dense_{index + 1}"
            )(hidden)
    elif model_name == "cnn":
        hidden = keras.layers.Reshape((features, 1), name="channels")(hidden)
        for index, filters in enumerate(config.cnn_filters):
            hidden = keras.layers.Conv1D(
                filters,
                5 if index == 0 else 3,
                strides=2,
                padding="same",
                activation="relu",
                name=f"conv_{index + 1}",
            )(hidden)
        hidden = keras.layers.Flatten(name="flatten")(hidden)
    else:
        raise ValueError(f"Unknown model {model_name!r}; expected one of {MODELS}.")
    outputs = keras.layers.Dense(classes, name="head")(hidden)
    return maskfit.MaskedModel(inputs, outputs, name=model_name)


def draw_weights(model, entropy, numpy=False):
    """Sets every kernel from its initializer seeded by `entropy`; biases to 0.

    With `numpy`, a Glorot-uniform kernel is drawn by NumPy instead (the same
    distribution, Keras's fans): the same numbers under every backend, where
    Keras's seeded initializers draw other numbers per backend.
    """
    for index, layer in enumerate(model.layers):
        if not hasattr(layer, "kernel"):
            continue
        shape = tuple(layer.kernel.shape)
        initializer = layer.kernel_initializer
        if numpy:
            if not isinstance(initializer, keras.initializers.GlorotUniform):
                raise ValueError(
                    f"numpy_weights draws Glorot-uniform kernels; layer"
                    f" '{layer.name}' has {type(initializer).__name__}."
                )
            layer.kernel.assign(common.glorot_uniform(shape, [*entropy, index]))
        else:
            state = np.random.SeedSequence([*entropy, index])
            seed = int(state.generate_state(1)[0])
            initializer = type(initializer).from_config(
                {**initializer.get_config(), "seed": seed}
            )
            layer.kernel.assign(initializer(shape))
        if layer.bias is not None:
            layer.bias.assign(np.zeros(layer.bias.shape, np.float32))


def dynamic_arguments(sparsity, config, seed):
    """`maskfit.sparse.sparsify`'s arguments for a SET or RigL run of `config`."""
    return dict(
        sparsity=sparsity,
        t_end=max(1, int(config.t_end_fraction * config.train_steps)),
        delta_t=config.delta_t,
        alpha=config.alpha,
        drop_fraction_anneal=config.drop_fraction_anneal,
        sparsity_distribution=config.sparsity_distribution,
        dense_first_layer=config.dense_first_layer,
        seed=seed,
    )


def dynamic_rule(method, sparsity, config, seed):
    """The `maskfit.sparse` rule of a SET or RigL run (the schedule of `config`)."""
    rule_class = sparse.METHODS[method]
    return rule_class(**dynamic_arguments(sparsity, config, seed))


def pruning_schedule(sparsity, config):
    """Zhu & Gupta's schedule from 0 to `sparsity`, every `delta_t` steps.

    It runs between `prune_begin_fraction` and `prune_end_fraction` of
    training; the end is moved back onto the `delta_t` grid from the begin
    step, so that the last pruning step reaches `sparsity`.
    """
    begin = int(config.prune_begin_fraction * config.train_steps)
    window = int(config.prune_end_fraction * config.train_steps) - begin
    frequency = min(config.delta_t, window)
    return pruning.PolynomialDecay(
        0.0,
        sparsity,
        begin_step=begin,
        end_step=begin + window // frequency * frequency,
        frequency=frequency,
    )


def declare_method(model, method, sparsity, config, seed):
    """Makes built `model` train by `method` at `sparsity`; returns the allocation.

    Every sparse method gets the same per-layer sparsities (`sparse.allocate`
    with the config's distribution), so they train the same number of
    weights per layer; "static" and the dynamic methods also start from the
    same random mask of the seed.

    - "dense": nothing.
    - "static": the seed's random masks as `ElementMask`s, masked-out
      weights set to 0 first, so they stay exactly 0.
    - "pruning": `prune_low_magnitude` per layer, `PolynomialDecay` from 0 to
      the layer's sparsity between `prune_begin_fraction` and
      `prune_end_fraction` of training, every `delta_t` steps.
    - "set", "rigl": `maskfit.sparse.sparsify` of the model: the same
      allocation, starting from the same random masks as "static".

    Returns:
      The list of `sparse.LayerSparsity` (empty for "dense").
    """
    if method == "dense":
        return []
    entries = sparse.allocate(
        model,
        sparsity,
        config.sparsity_distribution,
        dense_first_layer=config.dense_first_layer,
    )
    if method == "static":
        by_layer = {}
        for entry, keep in zip(entries, sparse.random_keep_masks(entries, seed)):
            entry.variable.assign(np.where(keep, entry.variable.numpy(), 0))
            by_layer.setdefault(entry.layer, {})[entry.variable.name] = keep
        for layer, masks in by_layer.items():
            maskfit.set_mask(layer, maskfit.ElementMask(masks))
    elif method == "pruning":
        for entry in entries:
            if entry.sparsity > 0:
                schedule = pruning_schedule(entry.sparsity, config)
                pruning.prune_low_magnitude(entry.layer, pruning_schedule=schedule)
    elif method in DYNAMIC_METHODS:
        sparse.sparsify(model, method, **dynamic_arguments(sparsity, config, seed))
    else:
        raise ValueError(f"Unknown method {method!r}; expected one of {METHODS}.")
    return entries


def batches(data, config, seed):
    """`train_steps` batches of the training set, reshuffled each pass, for `seed`.

    The batches are gathered from the training set by index inside tf.data
    (not copied out beforehand: 3,000 batches of 100 MNIST-1D examples are
    48 MB, and copying them took 0.5 s of every training).
    """
    rng = np.random.default_rng([seed, 0])
    needed = config.train_steps * config.batch_size
    passes = -(-needed // len(data.x_train))
    order = np.concatenate([rng.permutation(len(data.x_train)) for _ in range(passes)])[
        :needed
    ]
    x, y = tf.constant(data.x_train), tf.constant(data.y_train)
    dataset = tf.data.Dataset.from_tensor_slices(order).batch(config.batch_size)
    return dataset.map(lambda index: (tf.gather(x, index), tf.gather(y, index)))


class _Curve(keras.callbacks.Callback):
    """Test accuracy every `eval_every` steps (at each `fit` epoch's end)."""

    def __init__(self, evaluate):
        super().__init__()
        self._evaluate = evaluate
        self.points = []  # (step, test accuracy)

    def on_epoch_end(self, epoch, logs=None):
        step = int(self.model.optimizer.iterations.numpy())
        self.points.append((step, float(self._evaluate())))


def _evaluator(model, data):
    """The test accuracy of `model`'s current weights, on any Keras backend.

    The forward pass runs eagerly: a `tf.function` around a JAX model would
    bake the weights of its first call into the graph (and under JAX the
    callback's `self.model` has just written the trainer's state into the
    variables).
    """

    def evaluate():
        logits = keras.ops.convert_to_numpy(model(data.x_test, training=False))
        return np.mean(np.argmax(logits, axis=-1) == data.y_test)

    return evaluate


def train(task, method, sparsity, seed, data, config, callbacks=()):
    """Trains one fresh model of `task` by `method` at `sparsity`; returns its result.

    Args:
      task: "<data set>/<model>", e.g. "mnist1d/mlp".
      method: one of `METHODS`.
      sparsity: the target sparsity (ignored for "dense").
      seed: the seed of the weights, the masks and the batch order.
      data: the task's `datasets.Split`.
      config: the experiment's `Config`.
      callbacks: extra Keras callbacks for this training.

    Returns:
      A dict: `test_accuracy` (at the end), `curve` ([step, accuracy]),
      `kernel_density` (non-zero kernel weights over all, per layer and
      "all", at the end), `allocated` (the layers' planned sparsities),
      `seconds` and `cpu_seconds` (this process's CPU time).
    """
    start, start_cpu = time.perf_counter(), time.process_time()
    model_name = task.split("/")[1]
    model = build_model(model_name, data.features, data.classes, config)
    draw_weights(model, [seed], numpy=config.numpy_weights)
    entries = declare_method(model, method, sparsity, config, seed)
    optimizer = common.make_optimizer(config.optimizer, config.learning_rate)
    model.compile(
        optimizer=optimizer,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        steps_per_execution=math.gcd(config.eval_every, config.steps_per_execution),
        jit_compile=common.compiled_step(config.jit_compile),
    )
    curve = _Curve(_evaluator(model, data))
    model.fit(
        batches(data, config, seed),
        epochs=config.train_steps // config.eval_every,
        steps_per_epoch=config.eval_every,
        shuffle=False,
        verbose=0,
        callbacks=[curve, *callbacks],
    )
    kernels = {
        layer.name: layer.kernel.numpy()
        for layer in model.layers
        if hasattr(layer, "kernel")
    }
    nonzero = {name: int(np.count_nonzero(k)) for name, k in kernels.items()}
    sizes = {name: k.size for name, k in kernels.items()}
    density = {name: nonzero[name] / sizes[name] for name in kernels}
    density["all"] = sum(nonzero.values()) / sum(sizes.values())
    return {
        "test_accuracy": curve.points[-1][1],
        "curve": [list(point) for point in curve.points],
        "kernel_density": density,
        "allocated": {e.layer.name: e.sparsity for e in entries},
        "seconds": time.perf_counter() - start,
        "cpu_seconds": time.process_time() - start_cpu,
    }
