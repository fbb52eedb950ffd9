"""Latency of the causal LMs: TensorFlow, LiteRT and PyTorch, side by side.

Every contender runs one fixed batch of token windows (the whole context,
logits out) and blocks until done: a `tf.function` of the Keras model
("tensorflow"), the same compiled by XLA (`jit_compile=True`, "xla"),
Keras's LiteRT export of it run by the LiteRT interpreter
with one thread ("litert"), and the PyTorch model under `inference_mode`
("torch"). `measure` times all of them in interleaved rounds
(`experiments.common.latency.interleaved`), so a slow patch of a shared
machine hits all, and gives each shrunk model's time as a ratio to its
own framework's dense model, round by round.
"""

import os
import tempfile
import warnings

import keras
import numpy as np
import tensorflow as tf

from experiments.common import latency

__all__ = ["PATHS", "keras_call", "measure"]

PATHS = ("tensorflow", "xla", "litert")


def _tokens(batch, length, vocabulary, seed=0):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, vocabulary, (batch, length)).astype(np.int32)
    return {"token_ids": tokens, "padding_mask": np.ones_like(tokens)}


def keras_call(model, batch, length, vocabulary, path):
    """A zero-argument callable running `model` on a fixed batch by `path`.

    Returns `(call, max abs difference)`: for "xla" and "litert" the largest
    difference of their logits from the model's own (float32, no
    quantization), for "tensorflow" 0.
    """
    x = _tokens(batch, length, vocabulary)
    if path in ("tensorflow", "xla"):
        inputs = {k: tf.constant(v) for k, v in x.items()}
        function = tf.function(
            lambda: model(inputs, training=False), jit_compile=path == "xla"
        )
        logits = np.asarray(function())
        if path == "tensorflow":
            return function, 0.0
        expected = np.asarray(model(x, training=False))
        return function, float(np.max(np.abs(logits - expected)))
    with tempfile.TemporaryDirectory() as directory:
        target = os.path.join(directory, "model.tflite")
        signature = [{k: tf.TensorSpec(v.shape, tf.int32) for k, v in x.items()}]
        model.export(target, format="litert", input_signature=signature, verbose=False)
        with open(target, "rb") as f:
            content = f.read()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the move to ai-edge-litert
        interpreter = tf.lite.Interpreter(model_content=content, num_threads=1)
    interpreter.allocate_tensors()
    # The export flattens the dict by sorted key; its inputs are named in that order.
    details = sorted(interpreter.get_input_details(), key=lambda d: d["name"])
    values = keras.tree.flatten(x)
    (output,) = interpreter.get_output_details()

    def call():
        for detail, value in zip(details, values):
            interpreter.set_tensor(detail["index"], value)
        interpreter.invoke()
        return interpreter.get_tensor(output["index"])

    expected = np.asarray(model(x, training=False))
    return call, float(np.max(np.abs(call() - expected)))


def measure(keras_models, torch_models, batches, length, vocabulary, rounds, paths):
    """Times every model at each batch size; returns one row per (batch, contender).

    Args:
      keras_models, torch_models: `{fraction: model}`, fraction 0.0 the dense
        one (`torch_models` may be empty).
      batches: batch sizes.
      rounds: interleaved rounds timed.
      paths: Keras inference paths (`PATHS`).

    Returns:
      Rows `{"batch", "framework", "fraction", "ms", "ratio", "logits_error"}`,
      where "ms" and "ratio" are `latency.summarize`'s (wall time; ratio to
      the same framework's dense model, paired by round) and "logits_error"
      `keras_call`'s (None for torch).
    """
    rows = []
    for batch in batches:
        contenders, errors = {}, {}
        for path in paths:
            for fraction, model in keras_models.items():
                call, error = keras_call(model, batch, length, vocabulary, path)
                contenders[(path, fraction)] = call
                errors[(path, fraction)] = error
        if torch_models:
            from experiments.transformer_pruning import torch_arm

            for fraction, model in torch_models.items():
                contenders[("torch", fraction)] = torch_arm.inference(
                    model, batch, length
                )
        keys = list(contenders)
        flat = {str(i): contenders[key] for i, key in enumerate(keys)}
        calls = latency.calls_per_round(flat["0"], 0.2, most=50)
        wall, _ = latency.interleaved(flat, rounds, calls)
        for framework in dict.fromkeys(key[0] for key in keys):
            own = [i for i, key in enumerate(keys) if key[0] == framework]
            base = next(str(i) for i in own if keys[i][1] == 0.0)
            summary = latency.summarize({str(i): wall[str(i)] for i in own}, base)
            for i in own:
                rows.append(
                    {
                        "batch": batch,
                        "framework": framework,
                        "fraction": keys[i][1],
                        "ms": summary[str(i)]["ms"],
                        "ratio": summary[str(i)]["ratio"],
                        "logits_error": errors.get(keys[i]),
                    }
                )
    return rows
