"""Inference latency, measured side by side: interleaved rounds, paired ratios.

`interleaved` times any number of zero-argument callables round-robin: each
round calls every contender `calls` times in a row (the order rotates from
round to round), so a slow patch of a shared machine hits them all; the
per-round times are then summarised by `summarize` as medians and paired
ratios to a baseline (shrunk over dense). `keras_inference` makes such a
callable of a Keras model by one of `KERAS_PATHS`; the PyTorch one is in
`benchmarks.torch_models`. `set_tensorflow_threads` fixes TensorFlow's
thread pools, which must happen before TensorFlow runs its first op.
"""

import os
import tempfile
import time
import warnings

import numpy as np
import tensorflow as tf

__all__ = [
    "KERAS_PATHS",
    "interleaved",
    "calls_per_round",
    "compare",
    "keras_inference",
    "set_tensorflow_threads",
    "summarize",
]

# How a Keras model can answer a batch at inference:
# - "function": a `tf.function` of `model(x, training=False)` (one graph),
# - "xla": the same with `jit_compile=True`,
# - "predict_on_batch": Keras's own compiled predict function (one step),
# - "eager": `model(x, training=False)` op by op,
# - "tflite": Keras's LiteRT export (`model.export(format="litert")`,
#   float32, no quantization) run by `tf.lite.Interpreter` (XNNPACK) with
#   TensorFlow's intra-op thread count (TensorFlow 2.20+ points to the
#   `ai-edge-litert` package's interpreter, the same runtime).
KERAS_PATHS = ("function", "xla", "predict_on_batch", "eager", "tflite")


def set_tensorflow_threads(intra_op, inter_op):
    """Sets TensorFlow's intra-op and inter-op thread pools, once, before any op.

    Raises:
      RuntimeError: if TensorFlow has already started with other settings
        (set them at the start of the process, before building a model).
    """
    threading = tf.config.threading
    current = (
        threading.get_intra_op_parallelism_threads(),
        threading.get_inter_op_parallelism_threads(),
    )
    if current == (intra_op, inter_op):
        return
    try:
        threading.set_intra_op_parallelism_threads(intra_op)
        threading.set_inter_op_parallelism_threads(inter_op)
    except RuntimeError as e:
        raise RuntimeError(
            "TensorFlow's thread pools are already running with"
            f" (intra_op, inter_op)={current}; set them before any TensorFlow op."
            f" Received: intra_op={intra_op!r}, inter_op={inter_op!r}"
        ) from e


def keras_inference(model, batch, path="function", seed=0):
    """Returns a callable that runs `model` on one fixed batch of `batch` examples.

    The batch is drawn once (standard normal, `seed`) in the model's input
    shape; the callable returns only when the outputs are computed. It has
    been called once, so tracing and compiling are done.

    Args:
      model: a built Keras model with one input.
      batch: examples per call.
      path: one of `KERAS_PATHS`.
      seed: seeds the batch.

    Raises:
      ValueError: for an unknown path.

    Example:

    >>> import keras
    >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    >>> run = keras_inference(model, batch=3)
    >>> run().shape
    TensorShape([3, 2])
    """
    if path not in KERAS_PATHS:
        raise ValueError(
            f"Received an unknown inference path, expected one of {KERAS_PATHS}."
            f" Received: path={path!r}"
        )
    shape = (batch,) + tuple(model.inputs[0].shape[1:])
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    if path == "predict_on_batch":
        model.predict_on_batch(x)  # Keras compiles its predict function here.
        return lambda: model.predict_on_batch(x)
    if path == "tflite":
        return _tflite_inference(model, x)
    x = tf.constant(x)
    if path == "eager":
        call = lambda: model(x, training=False)  # noqa: E731
    else:
        function = tf.function(
            lambda inputs: model(inputs, training=False),
            jit_compile=path == "xla",
            reduce_retracing=True,
        )
        call = lambda: function(x)  # noqa: E731
    call()
    return call


def _tflite_inference(model, x):
    """A callable running `model` on `x` in the TFLite interpreter (float32).

    The model goes through Keras's own LiteRT export (`model.export(...,
    format="litert")`, via a SavedModel, weights frozen) for `x`'s shape.
    """
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "model.tflite")
        signature = [tf.TensorSpec(x.shape, tf.float32)]
        try:
            model.export(
                path, format="litert", input_signature=signature, verbose=False
            )
            with open(path, "rb") as f:
                content = f.read()
        except ValueError as e:  # An older Keras: no LiteRT export yet.
            if "format" not in str(e):
                raise
            # The SavedModel that Keras's LiteRT export goes through, converted.
            saved = os.path.join(directory, "saved_model")
            model.export(saved, input_signature=signature, verbose=False)
            content = tf.lite.TFLiteConverter.from_saved_model(saved).convert()
    threads = tf.config.threading.get_intra_op_parallelism_threads() or None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # The move to ai-edge-litert.
        interpreter = tf.lite.Interpreter(model_content=content, num_threads=threads)
    interpreter.allocate_tensors()
    (source,) = interpreter.get_input_details()
    (target,) = interpreter.get_output_details()

    def call():
        interpreter.set_tensor(source["index"], x)
        interpreter.invoke()
        return interpreter.get_tensor(target["index"])

    call()
    return call


def interleaved(contenders, rounds, calls, warmup=1):
    """Times each callable of `contenders`, round-robin; returns seconds per call.

    Args:
      contenders: `{key: zero-argument callable}`; each call must block
        until its work is done.
      rounds: rounds timed (each yields one time per contender).
      calls: calls in a row per contender per round; their mean is the
        round's time, so one round's time is well above the clock's grain.
      warmup: untimed rounds first (caches, thread pools, lazy compiles).

    Returns:
      `(wall, cpu)`: each `{key: [seconds per call, one per round]}`, of
      wall-clock time and of this process's CPU time (all its threads),
      which other processes on a shared machine sway less.
    """
    keys = list(contenders)
    wall = {key: [] for key in keys}
    cpu = {key: [] for key in keys}
    for round_ in range(warmup + rounds):
        shift = round_ % len(keys)
        for key in keys[shift:] + keys[:shift]:
            call = contenders[key]
            start, start_cpu = time.perf_counter(), time.process_time()
            for _ in range(calls):
                call()
            seconds = (time.perf_counter() - start) / calls
            cpu_seconds = (time.process_time() - start_cpu) / calls
            if round_ >= warmup:
                wall[key].append(seconds)
                cpu[key].append(cpu_seconds)
    return wall, cpu


def _quantiles(values):
    values = np.asarray(values, np.float64)
    return {
        "median": float(np.median(values)),
        "min": float(np.min(values)),
        "p10": float(np.percentile(values, 10)),
        "p90": float(np.percentile(values, 90)),
    }


def summarize(times, baseline):
    """Summarises `interleaved`'s times against the contender `baseline`.

    Returns:
      `{key: {"ms": {"median", "min", "p10", "p90"}, "ratio": {...},
      "ratio_of_minima": r, "rounds": n}}`: the time per call in
      milliseconds over rounds; the per-round ratio of the key's time to
      the baseline's in the same round (paired), whose median is the
      figure to quote; and the ratio of their fastest rounds, the estimate
      least disturbed by other work on a busy machine.

    Example:

    >>> summary = summarize({"dense": [2.0, 2.0], "shrunk": [1.0, 1.2]}, "dense")
    >>> round(summary["shrunk"]["ratio"]["median"], 3)
    0.55
    """
    base = times[baseline]
    summary = {}
    for key, values in times.items():
        ratios = [t / b for t, b in zip(values, base)]
        summary[key] = {
            "ms": _quantiles([1e3 * t for t in values]),
            "ratio": _quantiles(ratios),
            "ratio_of_minima": min(values) / min(base),
            "rounds": len(values),
        }
    return summary


def calls_per_round(call, round_seconds, most=1000):
    """Calls in a row that last about `round_seconds` (at least 1, at most `most`)."""
    start = time.perf_counter()
    for _ in range(3):
        call()
    seconds = (time.perf_counter() - start) / 3
    return max(1, min(most, round(round_seconds / max(seconds, 1e-9))))


def compare(models, inference, batches, rounds, round_seconds, baseline="dense"):
    """Times `models` side by side at each batch size; returns a row per batch.

    Args:
      models: `{name: model}`, one of them `baseline`.
      inference: `inference(model, batch)` returns a zero-argument callable
        (`keras_inference`, `torch_models.torch_inference`, with the path
        bound).
      batches: batch sizes.
      rounds: interleaved rounds timed per batch size.
      round_seconds: about how long the baseline runs per round; every
        model makes the same number of calls per round.
      baseline: the model the ratios are to.

    Returns:
      A list of `{"batch", "calls_per_round", "wall": summarize(wall),
      "cpu": summarize(cpu)}`, one per batch size.
    """
    rows = []
    for batch in batches:
        contenders = {name: inference(model, batch) for name, model in models.items()}
        calls = calls_per_round(contenders[baseline], round_seconds)
        wall, cpu = interleaved(contenders, rounds, calls)
        rows.append(
            {
                "batch": batch,
                "calls_per_round": calls,
                "wall": summarize(wall, baseline),
                "cpu": summarize(cpu, baseline),
            }
        )
    return rows
