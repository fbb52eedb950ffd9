"""The run of tests/backend/test_data_parallel.py, in a process of its own.

JAX fixes its devices when it starts, so the test runs this script with
`XLA_FLAGS=--xla_force_host_platform_device_count=2 KERAS_BACKEND=jax`:

    python tests/helpers/data_parallel_run.py OUT.npz

It trains a masked model under `keras.distribution.DataParallel` over the
two CPU devices (AdamW: weight decay moves an unmasked frozen entry), and
saves, per device, every trainable variable's copy before and after, and
which entries are frozen.
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import jax  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402

import maskfit  # noqa: E402

HIDDEN_KEEP = (np.arange(4 * 8).reshape(4, 8) % 3 != 0).astype("float32")
HEAD_UNITS = [1.0, 0.0]


def replicas(variable):
    """The variable's copy on each device, by device id."""
    return {
        shard.device.id: np.array(shard.data)
        for shard in variable.value.addressable_shards
    }


def main(out):
    devices = jax.devices("cpu")
    assert len(devices) == 2, f"expected 2 CPU devices, found {devices}"
    keras.distribution.set_distribution(
        keras.distribution.DataParallel(devices=keras.distribution.list_devices("cpu"))
    )
    keras.utils.set_random_seed(5)
    inputs = keras.Input((4,))
    hidden = maskfit.set_mask(
        keras.layers.Dense(8, activation="relu", name="hidden"),
        maskfit.ElementMask({"kernel": HIDDEN_KEEP}),
    )
    head = maskfit.set_mask(
        keras.layers.Dense(2, name="head"), maskfit.OutputMask(HEAD_UNITS)
    )
    model = maskfit.MaskedModel(inputs, head(hidden(inputs)))
    model.compile(
        optimizer=keras.optimizers.AdamW(0.05, weight_decay=0.1),
        loss="mse",
        jit_compile=True,
    )
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 4)).astype("float32")
    y = rng.normal(size=(64, 2)).astype("float32")
    variables = [hidden.kernel, hidden.bias, head.kernel, head.bias]
    before = {v.path: replicas(v) for v in variables}
    history = model.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
    after = {v.path: replicas(v) for v in variables}
    frozen = {
        hidden.kernel.path: HIDDEN_KEEP == 0,
        hidden.bias.path: np.zeros(8, bool),
        head.kernel.path: np.broadcast_to(np.array(HEAD_UNITS) == 0, (8, 2)),
        head.bias.path: np.array(HEAD_UNITS) == 0,
    }
    arrays = {"losses": np.array(history.history["loss"])}
    for path in frozen:
        key = path.replace("/", "__")
        arrays[f"frozen:{key}"] = frozen[path]
        for device, value in before[path].items():
            arrays[f"before:{key}:{device}"] = value
        for device, value in after[path].items():
            arrays[f"after:{key}:{device}"] = value
    np.savez(out, **arrays)
    print(f"data parallel: ok on {len(devices)} devices")


if __name__ == "__main__":
    main(sys.argv[1])
