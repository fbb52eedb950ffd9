"""One compressed model: pruned one-shot, measured, healed, quantized, saved.

`prune` runs `maskfit.prune_oneshot` on a copy of the trained dense Llama
(timed; peak memory by `tracemalloc`, which sees NumPy's allocations, not
TensorFlow's); `heal` fine-tunes it as a `MaskedModel` with the same AdamW
as the dense training, so its pruned entries stay 0; `quantized` quantizes a
copy to int8 or int4, counts the pruned entries still exactly 0 in what each
layer multiplies by (the layer run on the identity), and measures the saved
`.keras` file.
"""

import contextlib
import os
import tempfile
import time
import tracemalloc
import warnings

import keras
import numpy as np

import maskfit
from experiments.transformer_pruning import keras_arm
from maskfit import internals
from maskfit.oneshot import views

__all__ = ["TARGETS", "heal", "masked_layers", "parse_target", "prune", "quantized"]

TARGETS = ("50%", "60%", "70%", "2:4", "4:8")


def parse_target(target):
    """`prune_oneshot`'s keywords for "50%" or "2:4"; raises ValueError otherwise."""
    if isinstance(target, str) and target.endswith("%"):
        try:
            return {"sparsity": float(target[:-1]) / 100}
        except ValueError:
            pass
    if isinstance(target, str) and ":" in target:
        return {"pattern": target}
    raise ValueError(
        "Received an invalid target, expected a percentage such as '50%' or an N:M"
        f" pattern such as '2:4'. Received: {target!r}"
    )


def calibration_batches(windows, batch_size):
    """The calibration windows as model inputs, `batch_size` windows a batch."""
    x, _ = keras_arm.model_inputs(windows)
    return [
        {k: v[start : start + batch_size] for k, v in x.items()}
        for start in range(0, len(windows), batch_size)
    ]


def _one_blas_thread():
    """NumPy's BLAS on one thread, where threadpoolctl (scikit-learn's) is installed.

    On a 2-core machine TensorFlow's threads and OpenBLAS's second one wait on
    each other: measured here on a loaded machine, a 344 x 344 Cholesky took
    9 ms on one OpenBLAS thread and 733 ms on two, and SparseGPT's whole pass
    on the experiment's Llama 2.0 s of CPU against 4.6 s.
    """
    try:
        import threadpoolctl
    except ImportError:
        return contextlib.nullcontext()
    return threadpoolctl.threadpool_limits(1, user_api="blas")


def prune(model, method, target, batches):
    """Prunes `model` in place; returns the report, wall and CPU seconds, peak NumPy bytes.

    The CPU seconds are the process's (all its threads), as the llmcompressor
    arm measures its own. NumPy's BLAS runs on one thread (`_one_blas_thread`).
    """
    tracemalloc.start()
    start, cpu = time.perf_counter(), time.process_time()
    try:
        with _one_blas_thread():
            report = maskfit.prune_oneshot(
                model, batches, method, **parse_target(target)
            )
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return report, (seconds, cpu), peak


def masked_layers(model):
    """`[(layer, (in, out) view, pruned (in, out) booleans)]` of the pruned layers."""
    found = []
    for layer in internals.sublayers(model):
        spec = maskfit.get_mask(layer)
        if spec is not None:
            view = views.kernel_view(layer)
            found.append((layer, view, view.matrix(spec.masks["kernel"] == 0) > 0.5))
    return found


def heal(model, heal_windows, optimizer, run_eagerly=False):
    """Fine-tunes `model` with its masks (`MaskedModel` over its layers); checks the zeros."""
    pruned = masked_layers(model)
    masked = maskfit.MaskedModel(model.inputs, model.outputs)
    keras_arm.train(masked, heal_windows, optimizer, run_eagerly)
    moved = sum(
        int(np.count_nonzero(view.matrix(keras.ops.convert_to_numpy(view.variable))[p]))
        for _, view, p in pruned
    )
    if moved:
        raise AssertionError(f"healing wrote {moved} pruned entries")


def _effective(layer, view):
    """The `(in, out)` matrix `layer` multiplies by: the layer run on the identity."""
    n = view.rows[0]
    x = np.eye(n, dtype="float32")
    if view.input_letters:
        contracted = [view.shape[a] for a in view.order[: len(view.contracted)]]
        source = view.input_letters.replace("...", "")
        moved = [2 + view.contracted.index(c) for c in source if c in view.contracted]
        x = np.transpose(x.reshape([1, n] + contracted), [0, 1] + moved)
    y = keras.ops.convert_to_numpy(layer(x))
    return np.asarray(y, np.float64).reshape(n, -1)


def saved_bytes(model):
    """The size of `model` saved as a `.keras` file."""
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "model.keras")
        model.save(path)
        return os.path.getsize(path)


def quantized(model, mode, arch, seed, validation):
    """A copy of `model` quantized to `mode`: zeros kept, perplexity, file size."""
    copy = keras_arm.clone(model, arch, seed)
    found = masked_layers(model)
    # The copy's layers in the same order (its names may carry a suffix).
    index = {id(layer): i for i, layer in enumerate(internals.sublayers(model))}
    with warnings.catch_warnings():  # "Layer Softmax does not have a quantize method"
        warnings.simplefilter("ignore", UserWarning)
        copy.quantize(mode)
    copy_layers = internals.sublayers(copy)
    kept = total = 0
    for layer, view, mask in found:
        matrix = _effective(copy_layers[index[id(layer)]], view)
        total += int(mask.sum())
        kept += int(np.sum(matrix[mask] == 0))
    return {
        "mode": mode,
        "zeros_kept": kept,
        "pruned": total,
        "perplexity": keras_arm.perplexity(copy, validation),
        "file_bytes": saved_bytes(copy),
    }
