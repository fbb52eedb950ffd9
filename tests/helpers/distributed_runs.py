"""The training runs of test_distribute.py and test_mixed_precision.py.

TensorFlow fixes its devices (and collective ops) when it first starts, so the
distributed tests run this script in a subprocess:

    python tests/helpers/distributed_runs.py mirrored OUT_DIR
    TF_CONFIG=... python tests/helpers/distributed_runs.py worker OUT_DIR

Each run saves, to `OUT_DIR/<run>.npz`, every trainable variable's value on
every replica before and after the masked phase, which entries are frozen,
and the logged losses; the tests check them with `assert_frozen_and_learning`
and compare runs. test_mixed_precision.py calls `train` in its own process.
"""

import os
import sys
import time

START = time.perf_counter()

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import maskfit  # noqa: E402
from maskfit import distribute  # noqa: E402

# The hidden kernel learns freely for one epoch (so optimizers build up
# history for all of it), then these entries are frozen.
HIDDEN_FROZEN = np.arange(24).reshape(4, 6) % 3 == 0
SCALE_KEEP = np.array([1, 0, 1, 1, 0, 1], "float32")
GATED_KEEP = np.array([1, 0, 1, 0, 1], "float32")
HEAD_KEEP = np.array([1, 0, 0.5], "float32")

# name: (optimizer factory, compile kwargs, dtype policy)
MIRRORED_RUNS = {
    "adamw": (lambda: keras.optimizers.AdamW(0.05, weight_decay=0.1), {}, "float32"),
    # Keras cannot run gradient accumulation under MirroredStrategy in a
    # tf.function on CPU (its cond holds a merge_call), stock models included.
    "adamw_accumulate_eager": (
        lambda: keras.optimizers.AdamW(
            0.05, weight_decay=0.1, gradient_accumulation_steps=2
        ),
        dict(run_eagerly=True),
        "float32",
    ),
    "sgd_momentum_float16": (
        lambda: keras.optimizers.SGD(0.1, momentum=0.9, weight_decay=0.05),
        {},
        "mixed_float16",
    ),
    "adamw_bfloat16": (
        lambda: keras.optimizers.AdamW(0.02, weight_decay=0.1),
        {},
        "mixed_bfloat16",
    ),
}
WORKER_RUNS = {
    "adamw": MIRRORED_RUNS["adamw"],
    "adamw_accumulate_eager": MIRRORED_RUNS["adamw_accumulate_eager"],
    "sgd_momentum_float16": MIRRORED_RUNS["sgd_momentum_float16"],
}


def data(n=64, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 4)).astype("float32")
    y = rng.normal(size=(n, 3)).astype("float32")
    return x, y


def build_model(masks=True, model_cls=maskfit.MaskedModel):
    """hidden (ElementMask) -> Scale (ElementMask) -> gated (OutputMask with
    backprop) -> head (OutputMask); a plain `model_cls` if not `masks`."""
    keras.utils.set_random_seed(7)
    inputs = keras.Input((4,))
    hidden = keras.layers.Dense(6, activation="tanh", name="hidden")
    scale = maskfit.layers.Scale(name="scale")
    gated = keras.layers.Dense(5, activation="tanh", name="gated")
    head = keras.layers.Dense(3, name="head")
    outputs = head(gated(scale(hidden(inputs))))
    if not masks:
        return model_cls(inputs, outputs)
    maskfit.set_mask(hidden, maskfit.ElementMask({"kernel": np.ones((4, 6))}))
    maskfit.set_mask(scale, maskfit.ElementMask({"scale": SCALE_KEEP}))
    maskfit.set_mask(gated, maskfit.OutputMask(GATED_KEEP, backprop=True))
    maskfit.set_mask(head, maskfit.OutputMask(HEAD_KEEP))
    return maskfit.MaskedModel(inputs, outputs)


def frozen_entries(variable):
    """Which entries of a variable of `build_model()` are frozen in phase 2."""
    layer, name = variable.path.split("/")[-2:]
    shape = tuple(variable.shape)
    if layer == "hidden":
        return HIDDEN_FROZEN if name == "kernel" else np.zeros(shape, bool)
    if layer == "scale":
        return SCALE_KEEP == 0
    keep = {"gated": GATED_KEEP, "head": HEAD_KEEP}[layer]
    return np.broadcast_to(keep == 0, shape)


def replica_values(strategy, variable):
    """The value of `variable` on each replica of this process."""
    return [
        np.asarray(v.numpy())
        for v in strategy.experimental_local_results(variable.value)
    ]


def train(strategy, optimizer, compile_kwargs, policy, masks=True, model_cls=None):
    """Trains one epoch with every entry free, then one with entries frozen."""
    distribute.set_precision(policy)
    try:
        with strategy.scope():
            model = build_model(masks, model_cls or maskfit.MaskedModel)
            model.compile(optimizer=optimizer(), loss="mse", **compile_kwargs)
        x, y = data()
        fit = dict(batch_size=16, shuffle=False, verbose=0)
        losses = model.fit(x, y, epochs=1, **fit).history["loss"]
        if masks:
            hidden = model.get_layer("hidden")
            keep = (~HIDDEN_FROZEN).astype("float32")
            maskfit.set_mask(hidden, maskfit.ElementMask({"kernel": keep}))
        out = {}
        for v in model.trainable_variables:
            out["before/" + v.path] = np.array(v.numpy())
        losses += model.fit(x, y, epochs=1, **fit).history["loss"]
        for v in model.trainable_variables:
            out["frozen/" + v.path] = frozen_entries(v)
            for i, value in enumerate(replica_values(strategy, v)):
                out[f"after/{i}/{v.path}"] = value
        out["loss"] = np.array(losses)
        out["optimizer"] = np.array(type(model.optimizer).__name__)
        out["replicas"] = np.array(strategy.num_replicas_in_sync)
        return out
    finally:
        distribute.set_precision("float32")


def assert_frozen_and_learning(result):
    """Frozen entries equal their phase-2 start on every replica; others moved."""
    for path in sorted(k.split("/", 1)[1] for k in result if k.startswith("before/")):
        before, frozen = result["before/" + path], result["frozen/" + path]
        keys = sorted(
            k for k in result if k.startswith("after/") and k.endswith("/" + path)
        )
        assert keys, f"No values saved for {path}"
        for key in keys:
            after = result[key]
            np.testing.assert_array_equal(after[frozen], before[frozen], err_msg=key)
            assert np.any(after[~frozen] != before[~frozen]), f"{key} did not learn"


def run_mirrored(out_dir):
    strategy = distribute.make_strategy("mirrored", logical_devices=2)
    default = distribute.make_strategy("default")
    for name, (optimizer, compile_kwargs, policy) in MIRRORED_RUNS.items():
        for label, current in (("default", default), ("mirrored", strategy)):
            result = train(current, optimizer, compile_kwargs, policy)
            np.savez(os.path.join(out_dir, f"{name}-{label}.npz"), **result)
            print(name, label, "done", time.perf_counter() - START, flush=True)
    # The logged loss of a model without masks, against stock Keras.
    optimizer, compile_kwargs, policy = MIRRORED_RUNS["adamw"]
    for label, model_cls in (("stock", keras.Model), ("masked", None)):
        result = train(strategy, optimizer, compile_kwargs, policy, False, model_cls)
        np.savez(os.path.join(out_dir, f"unmasked_loss-{label}.npz"), **result)


def run_worker(out_dir):
    strategy = distribute.make_strategy("multi_worker")
    task = strategy.cluster_resolver.task_id
    for name, (optimizer, compile_kwargs, policy) in WORKER_RUNS.items():
        result = train(strategy, optimizer, compile_kwargs, policy)
        result["chief"] = np.array(distribute.is_chief(strategy))
        np.savez(os.path.join(out_dir, f"{name}-worker{task}.npz"), **result)
        print(name, "worker", task, "done", time.perf_counter() - START, flush=True)


if __name__ == "__main__":
    command, out_dir = sys.argv[1:3]
    {"mirrored": run_mirrored, "worker": run_worker}[command](out_dir)
