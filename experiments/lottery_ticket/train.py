"""Training for the lottery ticket experiment: digits data, LeNet, one reused model.

`load_digits` splits scikit-learn's digits data; `batches` orders it for one
seed; `draw_weights` draws a fresh initialisation; `Trainer` trains the one
compiled `maskfit.MaskedModel` of a run from given weights under given kernel
masks, evaluating as it goes. `experiments.lottery_ticket.lib` runs the rounds with these.
"""

import math

import keras
import numpy as np
import tensorflow as tf

import maskfit
from experiments import common

__all__ = ["SPLIT_SEED", "Trainer", "batches", "draw_weights", "load_digits"]

# The split of the digits data is the same for every seed.
SPLIT_SEED = 0


def load_digits(config):
    """The digits data, scaled to [0, 1], split (stratified) into train/val/test."""
    try:
        from sklearn import datasets, model_selection
    except ImportError as e:
        raise ImportError(
            "The lottery ticket experiment trains on scikit-learn's digits data;"
            ' install it with `pip install ".[experiments]"` (or scikit-learn).'
        ) from e
    digits = datasets.load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int32)
    split = model_selection.train_test_split
    x_rest, x_test, y_rest, y_test = split(
        x, y, test_size=config.test_fraction, stratify=y, random_state=SPLIT_SEED
    )
    x_train, x_val, y_train, y_val = split(
        x_rest,
        y_rest,
        test_size=config.validation_fraction / (1 - config.test_fraction),
        stratify=y_rest,
        random_state=SPLIT_SEED,
    )
    return {
        "train": (x_train, y_train),
        "validation": (x_val, y_val),
        "test": (x_test, y_test),
    }


def batches(data, config, seed):
    """`train_steps` batches: the training set, reshuffled each pass, for `seed`."""
    x, y = data["train"]
    rng = np.random.default_rng([seed, 0])
    needed = config.train_steps * config.batch_size
    passes = -(-needed // len(x))
    order = np.concatenate([rng.permutation(len(x)) for _ in range(passes)])[:needed]
    dataset = tf.data.Dataset.from_tensor_slices((x[order], y[order]))
    return dataset.batch(config.batch_size)


def draw_weights(layers, entropy):
    """Fresh [kernel, bias] per layer: each layer's kernel initializer, zero bias."""
    weights = []
    for index, layer in enumerate(layers):
        seed = int(np.random.SeedSequence([*entropy, index]).generate_state(1)[0])
        initializer = layer.kernel_initializer
        initializer = type(initializer).from_config(
            {**initializer.get_config(), "seed": seed}
        )
        kernel = keras.ops.convert_to_numpy(initializer(tuple(layer.kernel.shape)))
        weights.append([kernel, np.zeros(layer.bias.shape, np.float32)])
    return weights


class _Recorder(keras.callbacks.Callback):
    """Evaluates every `eval_every` steps; snapshots the weights at `capture_step`."""

    def __init__(self, evaluate, layers, config, capture_step=None):
        super().__init__()
        self._evaluate = evaluate
        self._layers = layers
        self._config = config
        self._capture_step = capture_step
        self.curve = []  # (step, validation loss, test accuracy)
        self.captured = None

    def _snapshot(self):
        return [[w.numpy() for w in (l.kernel, l.bias)] for l in self._layers]

    def on_train_begin(self, logs=None):
        if self._capture_step == 0:
            self.captured = self._snapshot()

    def on_train_batch_end(self, batch, logs=None):
        step = int(self.model.optimizer.iterations.numpy())
        if step == self._capture_step:
            self.captured = self._snapshot()
        if step % self._config.eval_every == 0 or step == self._config.train_steps:
            loss, accuracy = self._evaluate()
            self.curve.append((step, float(loss), float(accuracy)))


class Trainer:
    """One compiled MaskedModel, reused for every training of a run.

    Each training sets the weights and the kernel masks and puts the
    optimizer's state back to new (zero moments, step 0), so it matches a
    fresh `compile()` without a retrace.
    """

    def __init__(self, config, data):
        self._config = config
        x_train, y_train = data["train"]
        classes = int(y_train.max()) + 1
        inputs = keras.Input((x_train.shape[1],))
        outputs, self.layers = inputs, []
        for index, units in enumerate(config.hidden_units + (classes,)):
            output = index == len(config.hidden_units)
            layer = keras.layers.Dense(
                units,
                activation=None if output else "relu",
                kernel_initializer="glorot_normal",
                name="output" if output else f"hidden_{index + 1}",
            )
            outputs = layer(outputs)
            self.layers.append(layer)
        self.model = maskfit.MaskedModel(inputs, outputs)
        self.set_masks([np.ones(l.kernel.shape, np.float32) for l in self.layers])
        optimizer = common.make_optimizer(config.optimizer, config.learning_rate)
        self.model.compile(
            optimizer=optimizer,
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            # Callbacks see every step the evaluation or the rewind needs.
            steps_per_execution=math.gcd(config.eval_every, config.rewind_step),
            jit_compile=config.jit_compile,
        )
        optimizer.build(self.model.trainable_variables)
        self._new_optimizer_state = [v.numpy() for v in optimizer.variables]
        self.evaluate = self._make_evaluate(data)

    def _make_evaluate(self, data):
        x_val, y_val = (tf.constant(a) for a in data["validation"])
        x_test, y_test = (tf.constant(a) for a in data["test"])

        @tf.function
        def evaluate():
            loss = keras.losses.sparse_categorical_crossentropy(
                y_val, self.model(x_val, training=False), from_logits=True
            )
            predicted = tf.argmax(self.model(x_test, training=False), axis=-1)
            correct = tf.equal(tf.cast(predicted, y_test.dtype), y_test)
            return tf.reduce_mean(loss), tf.reduce_mean(tf.cast(correct, tf.float32))

        return evaluate

    def set_masks(self, masks):
        for layer, mask in zip(self.layers, masks):
            maskfit.set_mask(layer, maskfit.ElementMask({"kernel": mask}))

    def train(self, weights, masks, batches, callbacks, capture_step=None):
        """Trains from `weights` (pruned entries set to +0) under `masks`.

        Returns:
          The `_Recorder` of the training, with the learning curve and the captured weights.
        """
        for layer, (kernel, bias), mask in zip(self.layers, weights, masks):
            layer.kernel.assign(np.where(mask > 0, kernel, np.float32(0)))
            layer.bias.assign(bias)
        self.set_masks(masks)
        for variable, value in zip(
            self.model.optimizer.variables, self._new_optimizer_state
        ):
            variable.assign(value)
        recorder = _Recorder(self.evaluate, self.layers, self._config, capture_step)
        self.model.fit(
            batches,
            epochs=1,
            shuffle=False,
            verbose=0,
            callbacks=[recorder, *callbacks],
        )
        return recorder
