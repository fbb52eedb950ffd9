"""Magnitude pruning side by side: TF-MOT on tf_keras, maskfit.pruning on Keras 3.

Every contender trains the same MLP (64-300-100-10) on scikit-learn's bundled
digits, from the same initial weights, on the same batches in the same order
(a tf.data pipeline both Keras versions read identically), with the same
schedule and Adam; each reports, per seed, the zeros of each kernel at every
pruning step, the final test accuracy and the step time. The contenders run
in one process, one after the other, their order rotating with the seed:
importing TF-MOT sets TF_USE_LEGACY_KERAS=1, which only changes what
`tf.keras` is; maskfit imports Keras 3 as `keras`, so both live side by side.

A contender is a function `(config, scenario, seed, data) -> record` in
`CONTENDERS`: TF-MOT's `prune_low_magnitude` on a tf_keras Sequential model
with `UpdatePruningStep`, and maskfit's on a Keras 3 Sequential model, no
callback. Both read the masks with a callback after each pruning step, off
the clock.

Steps are counted as TF-MOT's `pruning_step` counts them: the n-th training
batch is step n (1-based), and a schedule prunes in step n when it says so
for n.
"""

import dataclasses
import functools
import json
import os
import platform
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
class Config:
    """What to run; the defaults are those of issue 14."""

    scenarios: tuple = ("polynomial", "constant", "2:4")
    contenders: tuple = ("tfmot", "maskfit")
    seeds: tuple = (0, 1, 2, 3, 4)
    hidden: tuple = (300, 100)
    epochs: int = 15
    batch_size: int = 32
    learning_rate: float = 1e-3
    test_fraction: float = 0.2
    split_seed: int = 0
    max_train_examples: int = 0  # 0: all; a small number for smoke tests.

    def __post_init__(self):
        unknown = [s for s in self.scenarios if s not in SCENARIOS]
        if unknown:
            raise ValueError(
                f"Unknown scenarios {unknown}; expected some of {sorted(SCENARIOS)}."
            )
        unknown = [c for c in self.contenders if c not in CONTENDERS]
        if unknown:
            raise ValueError(
                f"Unknown contenders {unknown}; available: {sorted(CONTENDERS)}."
            )
        if not self.seeds or self.epochs < 1 or self.batch_size < 1:
            raise ValueError(
                "Need at least one seed, one epoch and a positive batch size."
                f" Received: seeds={self.seeds}, epochs={self.epochs},"
                f" batch_size={self.batch_size}"
            )


@dataclasses.dataclass(frozen=True)
class Data:
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray


def load_data(config):
    """Digits (8x8 images, 10 classes) scaled to [0, 1], split once by `split_seed`."""
    from sklearn import datasets
    from sklearn import model_selection

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


def steps_per_epoch(config, data):
    return -(-len(data.x_train) // config.batch_size)


def training_batches(config, data, seed):
    """All epochs' batches, in order: read with `steps_per_epoch` by either Keras."""
    rng = np.random.RandomState(10_000 + seed)
    epochs = []
    for _ in range(config.epochs):
        order = rng.permutation(len(data.x_train))
        epochs.append(
            tf.data.Dataset.from_tensor_slices(
                (data.x_train[order], data.y_train[order])
            ).batch(config.batch_size)
        )
    return functools.reduce(lambda a, b: a.concatenate(b), epochs)


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


def train_tfmot(config, scenario, seed, data):
    """TF-MOT's contender: `prune_low_magnitude` on a tf_keras Sequential model."""
    import tensorflow_model_optimization as tfmot
    from tensorflow_model_optimization.python.core.keras.compat import keras as tf_keras

    sparsity_api = tfmot.sparsity.keras
    tf_keras.backend.clear_session()
    tf_keras.utils.set_random_seed(seed)
    sizes = layer_sizes(config, data)
    layers = [
        tf_keras.layers.Dense(units, activation="relu" if i < len(sizes) - 2 else None)
        for i, units in enumerate(sizes[1:])
    ]
    model = tf_keras.Sequential([tf_keras.Input((sizes[0],))] + layers)
    for layer, (kernel, bias) in zip(layers, initial_weights(config, data, seed)):
        layer.set_weights([kernel, bias])
    schedule = getattr(sparsity_api, scenario["schedule"])(**scenario["arguments"])
    pruned = sparsity_api.prune_low_magnitude(
        model,
        pruning_schedule=schedule,
        sparsity_m_by_n=scenario["sparsity_m_by_n"],
    )
    pruned.compile(
        optimizer=tf_keras.optimizers.Adam(learning_rate=config.learning_rate),
        loss=tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    # The pruning wrappers (TF-MOT does not export their class); one kernel each.
    masks = [l.pruning_vars[0][1] for l in pruned.layers if hasattr(l, "pruning_vars")]
    spe = steps_per_epoch(config, data)
    points = pruning_points(schedule, scenario, spe * config.epochs)

    kernels = [l.pruning_vars[0][0] for l in pruned.layers if hasattr(l, "pruning_vars")]

    class Recorder(_Recorder, tf_keras.callbacks.Callback):
        def __init__(self):
            super().__init__(points, lambda: [m.numpy() for m in masks], kernels)
            # Logs stay tensors: no host sync per batch (a tf_keras attribute).
            self._supports_tf_logs = True

    recorder = Recorder()
    pruned.fit(
        training_batches(config, data, seed),
        epochs=config.epochs,
        steps_per_epoch=spe,
        shuffle=False,
        verbose=0,
        # UpdatePruningStep must come first: it zeroes the pruned weights at
        # the end of each epoch, before the recorder stops the clock.
        callbacks=[sparsity_api.UpdatePruningStep(), recorder],
    )
    stripped = sparsity_api.strip_pruning(pruned)
    kernels = [l.kernel.numpy() for l in stripped.layers]
    logits = stripped.predict(data.x_test, batch_size=256, verbose=0)
    return _record(config, scenario, data, points, recorder, kernels, logits, spe)


class _Recorder:
    """Reads the masks after each pruning step; times each epoch without that.

    A mixin for either Keras's `Callback`: `read_masks()` returns the 0/1
    masks of the kernels, `kernels` are the kernel variables.
    """

    def __init__(self, points, read_masks, kernels):
        super().__init__()
        self.points, self.read_masks, self.kernels = points, read_masks, kernels
        self.step, self.zeros, self.revived, self.epoch_seconds = 0, {}, {}, []
        self.pruned_nonzero = {}
        self.previous = [None] * len(kernels)

    def on_epoch_begin(self, epoch, logs=None):
        self.start, self.reading = time.perf_counter(), 0.0

    def on_train_batch_end(self, batch, logs=None):
        self.step += 1
        if self.step in self.points:
            start = time.perf_counter()
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

    def on_epoch_end(self, epoch, logs=None):
        elapsed = time.perf_counter() - self.start - self.reading
        self.epoch_seconds.append(elapsed)


def train_maskfit(config, scenario, seed, data):
    """maskfit's contender: `prune_low_magnitude` on a Keras 3 Sequential model."""
    import keras

    from maskfit import model as model_lib

    keras.backend.clear_session()
    keras.utils.set_random_seed(seed)
    sizes = layer_sizes(config, data)
    layers = [
        keras.layers.Dense(units, activation="relu" if i < len(sizes) - 2 else None)
        for i, units in enumerate(sizes[1:])
    ]
    model = keras.Sequential([keras.Input((sizes[0],))] + layers)
    for layer, (kernel, bias) in zip(layers, initial_weights(config, data, seed)):
        layer.set_weights([kernel, bias])
    schedule = getattr(pruning, scenario["schedule"])(**scenario["arguments"])
    pruned = pruning.prune_low_magnitude(
        model,
        pruning_schedule=schedule,
        sparsity_m_by_n=scenario["sparsity_m_by_n"],
    )
    pruned.compile(
        optimizer=keras.optimizers.Adam(learning_rate=config.learning_rate),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    variables = model_lib.all_trainable_variables(pruned)
    positions = [
        next(i for i, v in enumerate(variables) if v is layer.kernel) for layer in layers
    ]
    spe = steps_per_epoch(config, data)
    points = pruning_points(schedule, scenario, spe * config.epochs)

    def read_masks():
        keeps = model_lib.keep_masks(pruned)
        return [keeps[i] for i in positions]

    class Recorder(_Recorder, keras.callbacks.Callback):
        def __init__(self):
            super().__init__(points, read_masks, [l.kernel for l in layers])

    recorder = Recorder()
    pruned.fit(
        training_batches(config, data, seed),
        epochs=config.epochs,
        steps_per_epoch=spe,
        shuffle=False,
        verbose=0,
        callbacks=[recorder],
    )
    stripped = pruning.strip_pruning(pruned)
    kernels = [l.kernel.numpy() for l in stripped.layers]
    logits = stripped.predict(data.x_test, batch_size=256, verbose=0)
    return _record(config, scenario, data, points, recorder, kernels, logits, spe)


def _record(config, scenario, data, points, recorder, kernels, logits, spe):
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
    return {
        "test_accuracy": float(np.mean(np.argmax(logits, -1) == data.y_test)),
        "step_ms": median_step_ms(recorder.epoch_seconds, spe),
        "first_epoch_s": recorder.epoch_seconds[0],
        "kernel_sizes": {n: int(np.prod(s)) for n, s in zip(names, shapes)},
        "pruning_steps": steps,
        "follows_schedule": all(s["zeros"] == s["expected_zeros"] for s in steps),
        "revived_total": sum(sum(s["revived"].values()) for s in steps),
        "pruned_are_zero": all(
            not any(s["pruned_nonzero"].values()) for s in steps
        ),
        "final_zeros": {n: int(np.sum(k == 0)) for n, k in zip(names, kernels)},
    }


CONTENDERS = {"tfmot": train_tfmot, "maskfit": train_maskfit}


def run(config, workdir):
    """Trains every contender on every scenario and seed; writes JSON and markdown.

    Returns the results dict that `pruning_vs_tfmot.json` holds.
    """
    os.makedirs(workdir, exist_ok=True)
    with open(os.path.join(workdir, "config.json"), "w") as f:
        json.dump(dataclasses.asdict(config), f, indent=2)
    data = load_data(config)
    runs = []
    for i, seed in enumerate(config.seeds):
        # Rotate the order so that no contender always runs first.
        shift = i % len(config.contenders)
        order = config.contenders[shift:] + config.contenders[:shift]
        for scenario_name in config.scenarios:
            for contender in order:
                record = CONTENDERS[contender](
                    config, SCENARIOS[scenario_name], seed, data
                )
                record.update(contender=contender, scenario=scenario_name, seed=seed)
                runs.append(record)
    results = {
        "machine": _machine(),
        "config": dataclasses.asdict(config),
        "steps_per_epoch": steps_per_epoch(config, data),
        "runs": runs,
        "summary": summarize(runs),
    }
    with open(os.path.join(workdir, "pruning_vs_tfmot.json"), "w") as f:
        json.dump(results, f, indent=2)
    with open(os.path.join(workdir, "pruning_vs_tfmot.md"), "w") as f:
        f.write(format_markdown(results))
    return results


def summarize(runs):
    """One row per (scenario, contender): accuracy mean and spread, step time."""
    rows = []
    keys = sorted({(r["scenario"], r["contender"]) for r in runs})
    for scenario, contender in keys:
        group = [
            r for r in runs if (r["scenario"], r["contender"]) == (scenario, contender)
        ]
        accuracies = [r["test_accuracy"] for r in group]
        final = group[0]["final_zeros"]
        sizes = group[0]["kernel_sizes"]
        rows.append(
            {
                "scenario": scenario,
                "contender": contender,
                "seeds": len(group),
                "accuracy_mean": statistics.mean(accuracies),
                "accuracy_std": statistics.pstdev(accuracies),
                "step_ms_median": statistics.median(r["step_ms"] for r in group),
                "follows_schedule": all(r["follows_schedule"] for r in group),
                "revived_mean": statistics.mean(r["revived_total"] for r in group),
                "pruned_are_zero": all(r["pruned_are_zero"] for r in group),
                "final_sparsity": {n: final[n] / sizes[n] for n in final},
            }
        )
    return rows


def format_markdown(results):
    """The tables of the report: summary, sparsity per pruning step, per seed."""
    lines = ["## Summary", ""]
    lines.append(
        "| scenario | contender | seeds | test accuracy (mean ± std) | step ms (median)"
        " | zeros follow the schedule | pruned weights 0 after each pruning step"
        " | pruned entries revived (mean) | final sparsity per kernel |"
    )
    lines.append("|---|---|---|---|---|---|---|---|---|")
    for row in results["summary"]:
        final = ", ".join(f"{n}: {v:.3f}" for n, v in row["final_sparsity"].items())
        lines.append(
            f"| {row['scenario']} | {row['contender']} | {row['seeds']}"
            f" | {100 * row['accuracy_mean']:.2f} ± {100 * row['accuracy_std']:.2f}"
            f" | {row['step_ms_median']:.3f} | {'yes' if row['follows_schedule'] else 'NO'}"
            f" | {'yes' if row['pruned_are_zero'] else 'no'}"
            f" | {row['revived_mean']:.1f} | {final} |"
        )
    runs = results["runs"]
    for scenario in dict.fromkeys(r["scenario"] for r in runs):
        lines += ["", f"## Zeros per kernel at each pruning step: {scenario}", ""]
        lines.append(
            "Step n is the n-th training batch. A range means the seeds differ."
        )
        lines.append("")
        contenders = list(dict.fromkeys(r["contender"] for r in runs))
        group = [r for r in runs if r["scenario"] == scenario]
        names = list(group[0]["kernel_sizes"])
        header = ["step", "schedule sparsity"] + [
            f"{n} ({c})" for n in names for c in contenders
        ]
        lines.append("| " + " | ".join(header) + " |")
        lines.append("|" + "---|" * len(header))
        for index, point in enumerate(group[0]["pruning_steps"]):
            cells = [str(point["step"]), f"{point['schedule_sparsity']:.6f}"]
            for name in names:
                for contender in contenders:
                    values = [
                        r["pruning_steps"][index]["zeros"][name]
                        for r in group
                        if r["contender"] == contender
                        and len(r["pruning_steps"]) > index
                    ]
                    low, high = min(values), max(values)
                    cells.append(str(low) if low == high else f"{low}-{high}")
            lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "## Per seed", ""]
    lines.append(
        "| scenario | seed | contender | test accuracy | step ms | first epoch s |"
    )
    lines.append("|---|---|---|---|---|---|")
    for r in runs:
        lines.append(
            f"| {r['scenario']} | {r['seed']} | {r['contender']}"
            f" | {100 * r['test_accuracy']:.2f} | {r['step_ms']:.3f}"
            f" | {r['first_epoch_s']:.2f} |"
        )
    machine = results["machine"]
    lines += [
        "",
        f"Machine: {machine['platform']}, {machine['cores']} cores;"
        f" {', '.join(f'{k} {v}' for k, v in machine['versions'].items())}.",
        "",
    ]
    return "\n".join(lines)


def _machine():
    from importlib import metadata

    versions = {}
    for package in ("tensorflow", "keras", "tf_keras", "tensorflow-model-optimization"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = "not installed"
    return {
        "platform": platform.platform(),
        "cores": os.cpu_count(),
        "versions": versions,
    }
