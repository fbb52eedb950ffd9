"""One size of `benchmarks.scale`: every phase's time and peak memory, in one process.

Run as `python -m benchmarks.scale.measure all|pass '<size as JSON>'` (what
`lib.run` does, two processes per size), it prints one JSON line: per phase,
the wall time and the peak resident memory the phase added over what the
process held when it began (`all`); or the same of the one-shot structured
pass alone on a freshly built model (`pass`). The peak is read from `/proc/self/status` (`VmHWM`), reset
before each phase by writing 5 to `/proc/self/clear_refs` (Linux); where
that cannot be done the phase's memory is reported as None rather than a
number that is not the phase's own (`ru_maxrss` never goes down).
"""

import gc
import json
import os
import sys
import tempfile
import time

import keras
import numpy as np

import maskfit
import maskfit.pruning as pruning
from maskfit import internals

PHASES = (
    "build",
    "declare",
    "step_stock",
    "step_masked",
    "graph",
    "select",
    "shrink",
    "calibrate",
    "save_load",
)


def _status():
    found = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmHWM:", "VmRSS:")):
                found[line[:5]] = int(line.split()[1]) * 1024
    return found


def _reset_peak():
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


class Phases:
    """Times each phase and its added peak memory (bytes)."""

    def __init__(self):
        self.rows = {}

    def run(self, name, fn):
        gc.collect()
        resettable = _reset_peak()
        before = _status()["VmRSS"]
        start = time.perf_counter()
        result = fn()
        seconds = time.perf_counter() - start
        peak = _status()["VmHWM"] if resettable else None
        self.rows[name] = {
            "seconds": seconds,
            "peak_added_bytes": None if peak is None else max(peak - before, 0),
            "rss_before_bytes": before,
        }
        return result


def tokens(size, count, rng):
    """`count` examples of random token ids (no padding) at `size`'s sequence."""
    return {
        "token_ids": rng.integers(
            0, size["vocabulary_size"], (count, size["sequence"])
        ).astype("int32"),
        "padding_mask": np.ones((count, size["sequence"]), "int32"),
    }


def declare(model):
    """An ElementMask on every kernel: its first half of rows frozen.

    Returns:
      `(kernels, entries)`: how many kernels got a mask, and their entries.
    """
    count = entries = 0
    for layer in internals.sublayers(model):
        kernel = next((v for v in layer.weights if v.name == "kernel"), None)
        if kernel is None or not isinstance(
            layer, (keras.layers.Dense, keras.layers.EinsumDense)
        ):
            continue
        keep = np.ones(tuple(kernel.shape), bool)
        keep[: kernel.shape[0] // 2] = False
        maskfit.set_mask(layer, maskfit.ElementMask({"kernel": keep}))
        count += 1
        entries += keep.size
    return count, entries


def _first_step(model, batch):
    """Compiles `model` (SGD) and takes its first step, which traces it."""
    model.compile(
        optimizer=keras.optimizers.SGD(1e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    model.train_on_batch(batch, batch["token_ids"])


def _interleaved(models, batch, rounds=3):
    """Median step seconds of each model, and the median of per-round ratios.

    One step of each per round, the order alternating, so that what else
    the machine runs sways both alike.
    """
    times = {name: [] for name in models}
    for i in range(rounds):
        for name in models if i % 2 == 0 else reversed(list(models)):
            start = time.perf_counter()
            models[name].train_on_batch(batch, batch["token_ids"])
            times[name].append(time.perf_counter() - start)
    ratios = np.divide(times["masked"], times["stock"])
    found = {name: float(np.median(t)) for name, t in times.items()}
    found["ratio"] = float(np.median(ratios))
    return found


def build(size):
    """The `LlamaCausalLM` of `size` (float32, seeded), without a preprocessor."""
    import keras_hub

    keras.utils.set_random_seed(0)
    arguments = {k: v for k, v in size.items() if k not in ("sequence", "name")}
    arguments["dtype"] = "float32"
    backbone = keras_hub.models.LlamaBackbone(**arguments)
    return keras_hub.models.LlamaCausalLM(backbone=backbone, preprocessor=None)


def _weights_bytes(model):
    return int(
        sum(np.prod(v.shape) * np.dtype(v.dtype).itemsize for v in model.weights)
    )


def structured_pass(size):
    """The one-shot structured pass alone (`select_units(0.5)`, `shrink`) on a fresh model.

    Run in a process that holds nothing but the model, so its added peak is
    the pass's own (in `measure`, memory earlier phases freed is reused).
    """
    lm = build(size)
    phases = Phases()

    def one_shot():
        selection = pruning.select_units(lm, 0.5)
        return pruning.shrink(lm, selection, uniform=True)

    small = phases.run("pass", one_shot)
    row = phases.rows["pass"]
    return {
        **row,
        "weights_bytes": _weights_bytes(lm),
        "shrunk_weights_bytes": _weights_bytes(small),
    }


def measure(size, batches=8):
    """Every phase at one size (a dict of LlamaBackbone arguments and `sequence`)."""
    phases = Phases()
    rng = np.random.default_rng(0)
    lm = phases.run("build", lambda: build(size))
    params = int(lm.count_params())
    batch = tokens(size, 1, rng)
    kernels, entries = phases.run("declare", lambda: declare(lm))
    stock = keras.Model(lm.inputs, lm.outputs)
    phases.run("step_stock", lambda: _first_step(stock, batch))
    masked = maskfit.MaskedModel(lm.inputs, lm.outputs)
    phases.run("step_masked", lambda: _first_step(masked, batch))
    step = _interleaved({"stock": stock, "masked": masked}, batch)
    stock = None  # noqa: F841 (its steps are over; free it)
    graph = phases.run("graph", lambda: pruning.DependencyGraph(lm))
    del graph
    selection = phases.run("select", lambda: pruning.select_units(lm, 0.5))
    small = phases.run("shrink", lambda: pruning.shrink(lm, selection, uniform=True))
    shrunk_params = int(small.count_params())
    small = selection = None  # noqa: F841
    calibration = tokens(size, batches, rng)
    phases.run(
        "calibrate",
        lambda: pruning.ActivationImportance().calibrate(lm, calibration, batch_size=1),
    )

    def save_load():
        # The weights file with the masks (`model/persistence.py`), read back
        # into the model: a `.keras` file of a functional model around a
        # keras_hub CausalLM does not load in Keras 3.15 (its backbone's
        # container is skipped), with or without maskfit.
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, "masked.weights.h5")
            masked.save_weights(path)
            masked.load_weights(path)
            return sum(
                maskfit.get_mask(layer) is not None
                for layer in internals.sublayers(masked)
            )

    loaded_masks = phases.run("save_load", save_load)
    return {
        "size": size,
        "params": params,
        "weights_bytes": _weights_bytes(lm),
        "shrunk_params": shrunk_params,
        "masked_kernels": kernels,
        "masked_entries": int(entries),
        "loaded_masks": int(loaded_masks),
        "step_seconds": step,
        "phases": phases.rows,
    }


if __name__ == "__main__":
    part, size = sys.argv[1], json.loads(sys.argv[2])
    found = structured_pass(size) if part == "pass" else measure(size)
    print("RESULT " + json.dumps(found), flush=True)
