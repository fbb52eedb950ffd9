"""The task both pruning contenders train: data, model sizes, weights, batches, checks.

An MLP (64-300-100-10 by default) on scikit-learn's bundled digits, from
numpy Glorot weights, on batches both Keras versions read identically (one
tf.data dataset per epoch). Steps are counted as TF-MOT's `pruning_step`
counts them: the n-th training batch is step n (1-based), and a schedule
prunes in step n when it says so for n.
"""

import dataclasses
import statistics
import time

import numpy as np
import tensorflow as tf

from maskfit import pruning

SCENARIOS = {
    "polynomial": {
        "schedule": "PolynomialDecay",
        "arguments": {
            "initial_sparsity": 0.0,
            "final_sparsity": 0.9,
            "begin_step": 0,
            "end_step": 400,
            "frequency": 20,
        },
        "sparsity_m_by_n": None,
    },
    "constant": {
        "schedule": "ConstantSparsity",
        "arguments": {"target_sparsity": 0.9, "begin_step": 0, "frequency": 20},
        "sparsity_m_by_n": None,
    },
    # TF-MOT computes N:M masks once, in step 1, whatever the schedule.
    "2:4": {
        "schedule": "ConstantSparsity",
        "arguments": {"target_sparsity": 0.5, "begin_step": 0},
        "sparsity_m_by_n": (2, 4),
    },
}


@dataclasses.dataclass(frozen=True)
class Data:
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray


def load_data(config):
    """Digits (8x8 images, 10 classes) scaled to [0, 1], split once by `split_seed`."""
    from sklearn import datasets, model_selection

    digits = datasets.load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    x_train, x_test, y_train, y_test = model_selection.train_test_split(
        x,
        y,
        test_size=config.test_fraction,
        random_state=config.split_seed,
        stratify=y,
    )
    if config.max_train_examples:
        x_train = x_train[: config.max_train_examples]
        y_train = y_train[: config.max_train_examples]
    return Data(x_train, y_train, x_test, y_test)


def layer_sizes(config, data):
    return (data.x_train.shape[1],) + tuple(config.hidden) + (10,)


def kernel_names(config, data):
    sizes = layer_sizes(config, data)
    return [f"{a}x{b}" for a, b in zip(sizes, sizes[1:])]


def initial_weights(config, data, seed):
    """Glorot-uniform kernels and zero biases from numpy, shared by all contenders."""
    rng = np.random.RandomState(seed)
    sizes = layer_sizes(config, data)
    weights = []
    for fan_in, fan_out in zip(sizes, sizes[1:]):
        limit = np.sqrt(6.0 / (fan_in + fan_out))
        kernel = rng.uniform(-limit, limit, (fan_in, fan_out)).astype(np.float32)
        weights.append((kernel, np.zeros(fan_out, np.float32)))
    return weights


def build_mlp(keras_module, config, data, seed):
    """Returns `(model, layers)`: the task's Sequential MLP in `keras_module`.

    `keras_module` is Keras 3 (`keras`) or TF-MOT's `tf_keras`; the Dense
    layers start from `initial_weights`, the same in both.
    """
    keras_module.backend.clear_session()
    keras_module.utils.set_random_seed(seed)
    sizes = layer_sizes(config, data)
    layers = [
        keras_module.layers.Dense(
            units, activation="relu" if i < len(sizes) - 2 else None
        )
        for i, units in enumerate(sizes[1:])
    ]
    model = keras_module.Sequential([keras_module.Input((sizes[0],))] + layers)
    for layer, (kernel, bias) in zip(layers, initial_weights(config, data, seed)):
        layer.set_weights([kernel, bias])
    return model, layers


def compile_arguments(keras_module, config):
    """The arguments of `compile` for either contender: Adam, the loss, XLA or not."""
    return dict(
        optimizer=keras_module.optimizers.Adam(learning_rate=config.learning_rate),
        loss=keras_module.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=config.jit_compile,
    )


def steps_per_epoch(config, data):
    return -(-len(data.x_train) // config.batch_size)


def epoch_batches(config, data, seed):
    """One dataset of batches per epoch, in order, read alike by either Keras."""
    rng = np.random.RandomState(10_000 + seed)
    epochs = []
    for _ in range(config.epochs):
        order = rng.permutation(len(data.x_train))
        epochs.append(
            tf.data.Dataset.from_tensor_slices(
                (data.x_train[order], data.y_train[order])
            ).batch(config.batch_size)
        )
    return epochs


def expected_zeros(scenario, shape, sparsity):
    """Zeros the schedule asks for in a kernel of `shape` (ties aside)."""
    size = int(np.prod(shape))
    m_by_n = scenario["sparsity_m_by_n"]
    if m_by_n is None:
        return size - pruning.kept_count(size, sparsity)
    zeros, group = m_by_n
    channels_in = shape[-2]
    full, rest = divmod(channels_in, group)
    per_row = full * zeros + max(0, rest - (group - zeros))
    return per_row * (size // channels_in)


def pruning_points(schedule, scenario, total_steps):
    """`{step: sparsity}` of the steps (1-based) where masks are recomputed."""
    if scenario["sparsity_m_by_n"] is not None:
        return {1: 0.0}
    points = pruning.pruning_steps(schedule, 1, total_steps + 1)
    return dict(points)


def median_step_ms(epoch_seconds, steps):
    """The median epoch time per step, in ms, leaving out the first (tracing) epoch."""
    timed = epoch_seconds[1:] or epoch_seconds
    return 1000.0 * statistics.median(timed) / steps


class Recorder:
    """Reads the masks after each pruning step; times each epoch without that.

    A mixin for either Keras's `Callback`: `read_masks()` returns the 0/1
    masks of the kernels, `kernels` are the kernel variables. The state after
    step n is read when step n + 1 begins (or the epoch ends), so that no
    batch-end hook is overridden: Keras 3 then keeps its batch-end callbacks
    off the training thread, as in a `fit` without callbacks (tf_keras does
    with `_supports_tf_logs`).
    """

    def __init__(self, points, read_masks, kernels):
        super().__init__()
        self.points, self.read_masks, self.kernels = points, read_masks, kernels
        self.step, self.zeros, self.revived, self.epoch_seconds = 0, {}, {}, []
        # Process CPU seconds (all threads), less swayed by other processes.
        self.epoch_cpu_seconds = []
        self.pruned_nonzero = {}
        self.previous = [None] * len(kernels)

    def on_epoch_begin(self, epoch, logs=None):
        self.start, self.reading = time.perf_counter(), 0.0
        self.cpu_start, self.cpu_reading = time.process_time(), 0.0

    def on_train_batch_begin(self, batch, logs=None):
        self._read_if_due()
        self.step += 1  # the step about to run

    def on_epoch_end(self, epoch, logs=None):
        self._read_if_due()
        elapsed = time.perf_counter() - self.start - self.reading
        self.epoch_seconds.append(elapsed)
        cpu = time.process_time() - self.cpu_start - self.cpu_reading
        self.epoch_cpu_seconds.append(cpu)

    def _read_if_due(self):
        """Reads the state after step `self.step` if it pruned and was not read."""
        if self.step not in self.points or self.step in self.zeros:
            return
        start, cpu_start = time.perf_counter(), time.process_time()
        values = [np.asarray(v) for v in self.read_masks()]
        weights = [np.asarray(k.numpy()) for k in self.kernels]
        self.zeros[self.step] = [int(np.sum(v == 0)) for v in values]
        self.revived[self.step] = [
            0 if p is None else int(np.sum((p == 0) & (v != 0)))
            for p, v in zip(self.previous, values)
        ]
        # Pruned entries the optimizer moved off 0 in this step.
        self.pruned_nonzero[self.step] = [
            int(np.sum((v == 0) & (w != 0))) for v, w in zip(values, weights)
        ]
        self.previous = values
        self.reading += time.perf_counter() - start
        self.cpu_reading += time.process_time() - cpu_start


def record(config, scenario, data, points, recorder, kernels, logits):
    """What a contender reports for one run: zeros per pruning step, accuracy, time."""
    names = kernel_names(config, data)
    shapes = [k.shape for k in kernels]
    steps = []
    for step, sparsity in sorted(points.items()):
        zeros = recorder.zeros.get(step)
        if zeros is None:
            continue  # Training ended before this step.
        expected = [expected_zeros(scenario, s, sparsity) for s in shapes]
        steps.append(
            {
                "step": step,
                "schedule_sparsity": sparsity,
                "zeros": dict(zip(names, zeros)),
                "expected_zeros": dict(zip(names, expected)),
                # Entries pruned at the previous pruning step that are kept now.
                "revived": dict(zip(names, recorder.revived[step])),
                # Pruned entries that are not 0 after this step's update.
                "pruned_nonzero": dict(zip(names, recorder.pruned_nonzero[step])),
            }
        )
    spe = steps_per_epoch(config, data)
    return {
        "test_accuracy": float(np.mean(np.argmax(logits, -1) == data.y_test)),
        "step_ms": median_step_ms(recorder.epoch_seconds, spe),
        "epoch_seconds": list(recorder.epoch_seconds),
        "epoch_cpu_seconds": list(recorder.epoch_cpu_seconds),
        "first_epoch_s": recorder.epoch_seconds[0],
        "kernel_sizes": {n: int(np.prod(s)) for n, s in zip(names, shapes)},
        "pruning_steps": steps,
        "follows_schedule": all(s["zeros"] == s["expected_zeros"] for s in steps),
        "revived_total": sum(sum(s["revived"].values()) for s in steps),
        "pruned_are_zero": all(not any(s["pruned_nonzero"].values()) for s in steps),
        "final_zeros": {n: int(np.sum(k == 0)) for n, k in zip(names, kernels)},
    }
